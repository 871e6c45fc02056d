"""Tool calls out of a model's text as it streams in: the interface every parser implements, and the
text-and-tags machinery that the tag-delimited formats (hermes, qwen3_coder) share.

A parser is fed each new piece of a choice's text and answers with what that piece adds: content,
and tool-call deltas in OpenAI's shape (a call's first delta carries its id and name, later ones
append to its arguments). Feeding the whole text at once gives the same content and calls as
feeding it in any pieces, so the non-streamed response is the streamed one put together.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from hotpath.server.tags import find_first, partial_tag_len


@dataclass
class ToolCallDelta:
    index: int
    arguments: str = ""
    id: str | None = None  # the call's first delta carries its id and name
    name: str | None = None


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def add_arguments(self, index: int, text: str) -> None:
        if self.tool_calls and self.tool_calls[-1].index == index:
            self.tool_calls[-1].arguments += text
        else:
            self.tool_calls.append(ToolCallDelta(index, text))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(ABC):
    """`tools`: each function's name -> its parameters' JSON schema (what typed formats read)."""

    finish_reason = "tool_calls"  # a reply that called tools and stopped ends with this

    def __init__(self, tools: dict[str, dict]) -> None:
        self.tools = tools
        self.num_calls = 0

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta: ...

    @abstractmethod
    def finish(self) -> ParsedDelta:
        """What the held-back text adds once the output has ended."""

    def _begin_call(self, out: ParsedDelta, name: str) -> None:
        out.tool_calls.append(ToolCallDelta(self.num_calls, id=new_call_id(), name=name))
        self.num_calls += 1

    def _arguments(self, out: ParsedDelta, text: str) -> None:
        if text:
            out.add_arguments(self.num_calls - 1, text)


class TaggedToolParser(ToolParser):
    """Content with tool calls between tags. Text outside the calls is content, less the whitespace
    beside a call (held back while it may precede one); a start tag split across pieces is held back
    until it is whole, so no part of a call reaches the content. A call that cannot be read (no
    name) is given back as content, tags and all. A format may also read a call written without its
    tags where a call may begin (`_bare_call`)."""

    start_tags: tuple[str, ...]

    def __init__(self, tools: dict[str, dict]) -> None:
        super().__init__(tools)
        self._buffer = ""  # text outside calls not yet passed on: a possible start tag's beginning
        self._in_call = False
        self._pending_space = ""  # content's trailing whitespace, dropped if a call follows
        self._after_call = False  # drop the whitespace that follows a call
        self._at_start = True  # no content passed on yet

    @abstractmethod
    def _start_call(self, tag: str) -> None:
        """A call opened with `tag`; the text after the tag follows through _parse_call."""

    @abstractmethod
    def _parse_call(self, text: str, out: ParsedDelta) -> str | None:
        """Reads the call's next text; returns the text after the call's end once it has ended,
        None while the call goes on."""

    @abstractmethod
    def _finish_call(self, out: ParsedDelta) -> None:
        """The output ended inside a call."""

    def _bare_call(self, text: str) -> bool | None:
        """Whether `text` (no leading whitespace), at the start of the content or right after a
        call, is a call written without its tags (then _start_call("") and _parse_call read it),
        or None while that cannot be told yet. Tagged calls only, unless a format says otherwise."""
        return False

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._advance(text, out, final=False)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._in_call:
            self._finish_call(out)
        else:
            self._advance("", out, final=True)
        if not self._after_call:
            out.content += self._pending_space
        self._pending_space = ""
        return out

    def _advance(self, text: str, out: ParsedDelta, final: bool) -> None:
        while True:
            if self._in_call:
                rest = self._parse_call(text, out)
                if rest is None:
                    return
                self._in_call = False
                text = rest
            self._buffer += text
            text = ""
            opening = self._buffer.lstrip()
            if self._at_start or self._after_call:
                bare = self._bare_call(opening) if opening else None
                if bare is None and not final:
                    return
                if bare:
                    text, self._buffer = opening, ""
                    self._in_call = True
                    self._start_call("")
                    continue
            i, tag = find_first(self._buffer, self.start_tags)
            if tag is None:
                keep = 0 if final else partial_tag_len(self._buffer, self.start_tags)
                self._content(out, self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                return
            self._content(out, self._buffer[:i])
            text, self._buffer = self._buffer[i + len(tag):], ""
            self._in_call = True
            self._start_call(tag)

    def _begin_call(self, out: ParsedDelta, name: str) -> None:
        self._pending_space = ""
        self._after_call = True
        super()._begin_call(out, name)

    def _content(self, out: ParsedDelta, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        if not body:
            self._pending_space += text
            return
        self._at_start = False
        out.content += self._pending_space + body
        self._pending_space = text[len(body):]
