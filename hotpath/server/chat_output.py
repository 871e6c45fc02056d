"""One chat choice's text -> the assistant message's fields: `reasoning_content` (the reasoning
parser's), `content`, `tool_calls` (the tool parser's, fed the content left after the reasoning).

The same parser makes the streamed deltas and the whole message (the text fed at once), so a
streamed reply put together equals the non-streamed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hotpath.server.reasoning import Qwen3ReasoningParser
from hotpath.server.tool_parsers import ToolCallDelta, ToolParser


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ChatDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls += other.tool_calls

    def fields(self) -> dict:
        """The delta's fields in OpenAI's chunk shape (only those it has)."""
        delta: dict = {}
        if self.reasoning:
            delta["reasoning_content"] = self.reasoning
        if self.content:
            delta["content"] = self.content
        if self.tool_calls:
            delta["tool_calls"] = [_call_delta(c) for c in self.tool_calls]
        return delta


def _call_delta(c: ToolCallDelta) -> dict:
    if c.id is None:
        return {"index": c.index, "function": {"arguments": c.arguments}}
    return {"index": c.index, "id": c.id, "type": "function",
            "function": {"name": c.name, "arguments": c.arguments}}


class ChatOutputParser:
    """`reasoning` / `tools`: None where the server or the request asks for no parsing;
    `max_calls`: the calls kept (parallel_tool_calls off: 1), later ones dropped."""

    def __init__(self, reasoning: Qwen3ReasoningParser | None, tools: ToolParser | None,
                 max_calls: int | None = None) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.max_calls = max_calls

    @property
    def tools_called(self) -> bool:
        return self.tools is not None and self.tools.num_calls > 0

    def feed(self, text: str) -> ChatDelta:
        reasoning, content = self.reasoning.feed(text) if self.reasoning else ("", text)
        return self._tool_split(reasoning, content, final=False)

    def finish(self) -> ChatDelta:
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        return self._tool_split(reasoning, content, final=True)

    def _tool_split(self, reasoning: str, content: str, final: bool) -> ChatDelta:
        if self.tools is None:
            return ChatDelta(reasoning, content)
        delta = ChatDelta(reasoning)
        parsed = [self.tools.feed(content)]
        if final:
            parsed.append(self.tools.finish())
        for p in parsed:
            delta.content += p.content
            delta.tool_calls += [c for c in p.tool_calls if self.max_calls is None or c.index < self.max_calls]
        return delta

    def message(self, text: str) -> dict:
        """The whole message for a choice's final text (fed at once: a parser not yet fed)."""
        deltas = [self.feed(text), self.finish()]
        reasoning = "".join(d.reasoning for d in deltas)
        content = "".join(d.content for d in deltas)
        # reasoning_content always, as vLLM has it, so that clients may read it from any reply
        message: dict = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        if self.reasoning is not None or self.tools_called:
            message["content"] = content or None  # OpenAI's null beside tool calls
        calls: dict[int, dict] = {}
        for c in (c for d in deltas for c in d.tool_calls):
            if c.id is not None:
                calls[c.index] = {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            calls[c.index]["function"]["arguments"] += c.arguments
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message
