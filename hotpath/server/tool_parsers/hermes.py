"""`--tool-call-parser hermes`: Qwen2.5's and Qwen3's calls (Hermes' format),
`<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`.

Once `{"name": ..., "arguments": ` has arrived, the call's id and name go out and the arguments
follow as they stream, up to where their JSON value closes. A body that does not start that way
is read whole at `</tool_call>`; one that is not a call at all goes back to the content.

Small models leave the tags out (Qwen2.5-Coder-0.5B-Instruct answers with the bare object): a reply
whose content starts with `{"name": TOOL, "arguments": ` (TOOL one of the request's tools), or
that goes on that way right after a call, is read as a call that ends where its object closes. A
reply that starts with another `{` is held back only until its first characters say so.
"""

from __future__ import annotations

import json
import re

from hotpath.server.tags import partial_tag_len
from hotpath.server.tool_parsers.base import ParsedDelta, TaggedToolParser
from hotpath.server.tool_parsers.json_scan import JsonValueScanner

START, END = "<tool_call>", "</tool_call>"
# the key is "arguments" in the template's instructions; some fine-tunes write "parameters"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_BARE_HEADER_SLACK = 48  # `{"name": "", "arguments": ` and whitespace, beside the name


class HermesToolParser(TaggedToolParser):
    start_tags = (START,)

    def _bare_call(self, text: str) -> bool | None:
        if not text.startswith("{"):
            return False
        header = _HEADER.match(text)
        if header is not None:
            return json.loads(f'"{header.group(1)}"') in self.tools
        # a header of the longest tool name would have been read by now
        return None if len(text) < _BARE_HEADER_SLACK + max(map(len, self.tools), default=0) else False

    def _start_call(self, tag: str) -> None:
        # a call without its tags ends where its object closes
        self._object = JsonValueScanner() if tag == "" else None
        self._body = ""  # before the header is read: the call's text so far
        self._scanner: JsonValueScanner | None = None  # set once the arguments stream
        self._held = ""  # a possible beginning of END
        self._args_done = False

    def _parse_call(self, text: str, out: ParsedDelta) -> str | None:
        if self._object is not None:
            return self._parse_bare_call(text, out)
        if self._scanner is None:
            self._body += text
            header = _HEADER.match(self._body)
            if header is None:
                end = self._body.find(END)
                if end == -1:
                    return None
                rest = self._body[end + len(END):]
                self._whole_call(self._body[:end], out)
                return rest
            self._begin_call(out, json.loads(f'"{header.group(1)}"'))
            self._scanner = JsonValueScanner()
            text, self._body = self._body[header.end():], ""
        text, self._held = self._held + text, ""
        end = text.find(END)
        if end == -1:
            keep = partial_tag_len(text, (END,))
            text, self._held = text[:len(text) - keep], text[len(text) - keep:]
            self._stream_arguments(text, out)
            return None
        self._stream_arguments(text[:end], out)
        return text[end + len(END):]

    def _parse_bare_call(self, text: str, out: ParsedDelta) -> str | None:
        end = self._object.feed(text)
        call_text = text if end is None else text[:end]
        if self._scanner is None:  # the first text: it holds the header (_bare_call read it)
            header = _HEADER.match(call_text)
            self._begin_call(out, json.loads(f'"{header.group(1)}"'))
            self._scanner = JsonValueScanner()
            call_text = call_text[header.end():]
        self._stream_arguments(call_text, out)
        return None if end is None else text[end:]

    def _stream_arguments(self, text: str, out: ParsedDelta) -> None:
        if self._args_done:
            return  # the object's closing brace and whitespace, up to END
        if not self._scanner.started:
            text = text.lstrip()
        value_end = self._scanner.feed(text)
        if value_end is not None:
            text = text[:value_end]
            self._args_done = True
        self._arguments(out, text)

    def _finish_call(self, out: ParsedDelta) -> None:
        if self._scanner is None:
            self._whole_call(self._body, out, closed=False)
        else:
            self._stream_arguments(self._held, out)

    def _whole_call(self, body: str, out: ParsedDelta, closed: bool = True) -> None:
        """A body whose header did not stream: a call if it is one JSON object with a name and
        arguments (in any order), else content."""
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            call = None
        args = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
        if args is None or not isinstance(call.get("name"), str):
            self._content(out, START + body + (END if closed else ""))
            return
        self._begin_call(out, call["name"])
        self._arguments(out, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
