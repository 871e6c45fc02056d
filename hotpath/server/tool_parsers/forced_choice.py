"""`tool_choice: "required"` and a named function: the output is constrained to JSON by a schema
built from the tools (as vLLM builds it), so it always parses, and read back as tool calls.

- required: a JSON array of at least one `{"name": NAME, "parameters": {...}}`, each item one of
  the tools (anyOf), its parameters that tool's schema;
- a named function: that function's parameters object, the call's arguments as they are.
"""

from __future__ import annotations

import json
import re

from hotpath.server.tool_parsers.base import ParsedDelta, ToolParser
from hotpath.server.tool_parsers.json_scan import JsonValueScanner

_ANY_OBJECT = {"type": "object", "properties": {}}
# an item's opening, after the array's "[" or the previous item's "}" and ","
_ITEM = re.compile(r'[\s\[\]},]*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"parameters"\s*:\s*')


def function_schema(parameters: dict | None) -> dict:
    """A named function's constraint: its parameters' schema (any object where it has none)."""
    return parameters if parameters else _ANY_OBJECT


def required_schema(tools: dict[str, dict | None], parallel: bool = True) -> dict:
    """tool_choice "required": one or more calls (one with `parallel` off) of the given tools
    (name -> parameters schema). Each tool's `$defs` move to the root, where their `#/$defs/...`
    references point; two tools defining one name differently are a ValueError."""
    defs: dict[str, dict] = {}
    items = []
    for name, parameters in tools.items():
        parameters = dict(function_schema(parameters))
        for def_name, definition in parameters.pop("$defs", {}).items():
            if defs.setdefault(def_name, definition) != definition:
                raise ValueError(f"tools define $defs.{def_name} differently; tool_choice \"required\" "
                                 "needs each definition name to mean one schema")
        # no other keys: the parser reads an item as its name, then its parameters
        items.append({"properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema: dict = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


class RequiredToolParser(ToolParser):
    """Reads `[{"name": ..., "parameters": ...}, ...]` as it streams: each item's id and name once
    its name has arrived, its parameters as the call's arguments as they come."""

    def __init__(self, tools: dict[str, dict]) -> None:
        super().__init__(tools)
        self._buf = ""
        self._scanner: JsonValueScanner | None = None  # set while an item's parameters stream

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._buf:
            if self._scanner is None:
                item = _ITEM.match(self._buf)
                if item is None:
                    break
                self._begin_call(out, json.loads(f'"{item.group(1)}"'))
                self._scanner = JsonValueScanner()
                self._buf = self._buf[item.end():]
                continue
            if not self._scanner.started:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
            end = self._scanner.feed(self._buf)
            if end is None:
                self._arguments(out, self._buf)
                self._buf = ""
            else:
                self._arguments(out, self._buf[:end])
                self._buf = self._buf[end:]
                self._scanner = None
        return out

    def finish(self) -> ParsedDelta:
        return ParsedDelta()


class NamedFunctionParser(ToolParser):
    """The whole output is the named function's arguments."""

    finish_reason = "stop"  # OpenAI's (and vLLM's) for a named function

    def __init__(self, tools: dict[str, dict], name: str) -> None:
        super().__init__(tools)
        self.name = name

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if not self.num_calls:
            text = text.lstrip()
            if not text:
                return out
            self._begin_call(out, self.name)
        self._arguments(out, text)
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if not self.num_calls:  # nothing was generated: the call is still the one asked for
            self._begin_call(out, self.name)
        return out
