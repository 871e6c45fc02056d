"""`--reasoning-parser qwen3`: a reply's `<think>...</think>` block split off as `reasoning_content`,
the rest left as the content, as the text streams in.

Whether the reply starts inside the block is read from the prompt, not guessed from the reply:
templates that pre-fill `<think>` in the generation prompt (Qwen3's thinking-only checkpoints,
DeepSeek-R1; vllm#22507) leave the reply only `</think>`, so a prompt that ends in `<think>` starts
the reply in reasoning; one that does not (`enable_thinking: false` writes an empty block) starts it
as content unless the reply opens with `<think>` itself. The newlines the format puts around the
block (`<think>\\n...\\n</think>\\n\\n`) are dropped, as Qwen's template drops them when it reads a
reply back; a tag split across pieces is held back until it is whole.
"""

from __future__ import annotations

from hotpath.server.tags import partial_tag_len

THINK_START, THINK_END = "<think>", "</think>"


class Qwen3ReasoningParser:
    def __init__(self, prompt_tail: str) -> None:
        """`prompt_tail`: the end of the prompt's text, from its last few tokens."""
        self._state = "reasoning" if prompt_tail.rstrip().endswith(THINK_START) else "start"
        self._buf = ""  # held back: a possible <think> at the start, or a possible </think>
        self._reasoning_started = False
        self._newlines = ""  # the reasoning's trailing newlines, dropped if </think> follows
        self._after_block = False  # the content's leading newlines are the format's

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that this piece adds."""
        if self._state == "start":
            self._buf += text
            opening = self._buf.lstrip()
            if opening.startswith(THINK_START):
                self._state = "reasoning"
                text, self._buf = opening[len(THINK_START):], ""
            elif THINK_START.startswith(opening):
                return "", ""
            else:
                self._state = "content"
                text, self._buf = self._buf, ""
        if self._state == "content":
            return "", self._content(text)
        text, self._buf = self._buf + text, ""
        end = text.find(THINK_END)
        if end == -1:
            keep = partial_tag_len(text, (THINK_END,))
            self._buf = text[len(text) - keep:]
            return self._reasoning(text[:len(text) - keep]), ""
        reasoning = self._reasoning(text[:end])
        self._state, self._newlines, self._after_block = "content", "", True
        return reasoning, self._content(text[end + len(THINK_END):])

    def finish(self) -> tuple[str, str]:
        held, self._buf = self._buf, ""
        return (self._reasoning(held), "") if self._state == "reasoning" else ("", held)

    def _reasoning(self, text: str) -> str:
        if not self._reasoning_started:
            text = text.lstrip("\n")
            self._reasoning_started = bool(text)
        body = text.rstrip("\n")
        if not body:
            self._newlines += text
            return ""
        out = self._newlines + body
        self._newlines = text[len(body):]
        return out

    def _content(self, text: str) -> str:
        if self._after_block:
            text = text.lstrip("\n")
            self._after_block = not text
        return text


REASONING_PARSERS = {"qwen3": Qwen3ReasoningParser}  # --reasoning-parser names (vLLM's)
