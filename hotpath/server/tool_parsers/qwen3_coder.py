"""`--tool-call-parser qwen3_coder`: Qwen3-Coder's XML calls,

    <tool_call>
    <function=write_file>
    <parameter=path>
    notes.md
    </parameter>
    <parameter=lines>
    3
    </parameter>
    </function>
    </tool_call>

made into JSON arguments, {"path": "notes.md", "lines": 3}: a parameter's value is typed by the
function's schema (a string unless the schema says otherwise; one newline after the opening tag and
one before the closing tag are the format's, not the value's). A string value streams as it comes,
escaped for JSON, so a long file's content is not held until its end (vllm#30439); other values go
out when whole, converted. The model sometimes leaves out `<tool_call>`; `<function=` opens a call too.
"""

from __future__ import annotations

import json
import re

from hotpath.server.tags import find_first, partial_tag_len
from hotpath.server.tool_parsers.base import ParsedDelta, TaggedToolParser

CALL_END = "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_FUNCTION_TAG = re.compile(r"<function=([^>]*)>")
_PARAMETER_TAG = re.compile(r"<parameter=([^>]*)>")
# what may end a value: its own closing tag, or (left out by the model) what comes after it
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END, CALL_END)
_PARAMS_TAGS = (PARAMETER, FUNCTION_END, CALL_END)
_AFTER_TAGS = (FUNCTION, CALL_END)


class Qwen3CoderToolParser(TaggedToolParser):
    start_tags = ("<tool_call>", FUNCTION)

    def __init__(self, tools: dict[str, dict]) -> None:
        super().__init__(tools)
        self._readers = {"function": self._read_function, "params": self._read_params,
                         "value": self._read_value, "after": self._read_after}

    def _start_call(self, tag: str) -> None:
        self._opening = tag  # given back with the text if no function follows
        self._buf = FUNCTION if tag == FUNCTION else ""
        self._phase = "function"  # -> "params" <-> "value"; "after" past </function>

    def _parse_call(self, text: str, out: ParsedDelta) -> str | None:
        self._buf += text
        while True:
            step = self._readers[self._phase](out)
            if step is not True:
                return step

    # each phase reads self._buf: True to go on with the next phase, None to wait for more text,
    # or the text after the call once it has ended
    def _read_function(self, out: ParsedDelta) -> bool | str | None:
        header = _FUNCTION_TAG.search(self._buf)
        end = self._buf.find(CALL_END)
        if header is not None and (end == -1 or header.start() < end):
            self._name = header.group(1).strip()
            self._begin_call(out, self._name)
            self._arguments(out, "{")
            self._num_params = 0
            self._buf = self._buf[header.end():]
            self._phase = "params"
            return True
        if end == -1:
            return None
        self._content(out, self._opening + self._buf[:end + len(CALL_END)])
        return self._buf[end + len(CALL_END):]

    def _read_params(self, out: ParsedDelta) -> bool | str | None:
        i, tag = find_first(self._buf, _PARAMS_TAGS)
        if tag is None:
            self._buf = self._buf[len(self._buf) - partial_tag_len(self._buf, _PARAMS_TAGS):]
            return None
        if tag == PARAMETER:
            header = _PARAMETER_TAG.match(self._buf, i)
            if header is None:
                self._buf = self._buf[i:]
                return None
            name = header.group(1).strip()
            self._is_string = self._string_typed(name)
            self._arguments(out, (", " if self._num_params else "") + json.dumps(name, ensure_ascii=False)
                            + ": " + ('"' if self._is_string else ""))
            self._num_params += 1
            self._typed_text, self._value_started = "", False
            self._buf = self._buf[header.end():]
            self._phase = "value"
            return True
        self._arguments(out, "}")
        self._buf = self._buf[i + len(tag):]
        if tag == CALL_END:
            return self._buf
        self._phase = "after"
        return True

    def _value_piece(self, piece: str, out: ParsedDelta, last: bool) -> None:
        if not self._value_started and piece:
            self._value_started = True
            piece = piece.removeprefix("\n")
        if last:
            piece = piece.removesuffix("\n")
        if self._is_string:
            self._arguments(out, json.dumps(piece, ensure_ascii=False)[1:-1] + ('"' if last else ""))
            return
        self._typed_text += piece
        if last:
            self._arguments(out, json.dumps(self._typed(self._typed_text), ensure_ascii=False))

    def _read_value(self, out: ParsedDelta) -> bool | str | None:
        i, tag = find_first(self._buf, _VALUE_ENDS)
        if tag is None:
            keep = partial_tag_len(self._buf, _VALUE_ENDS)
            piece = self._buf[:len(self._buf) - keep]
            if piece.endswith("\n"):  # perhaps the newline before the closing tag: not the value's
                keep += 1
                piece = piece[:-1]
            self._value_piece(piece, out, last=False)
            self._buf = self._buf[len(self._buf) - keep:]
            return None
        self._value_piece(self._buf[:i], out, last=True)
        self._buf = self._buf[i + len(PARAMETER_END):] if tag == PARAMETER_END else self._buf[i:]
        self._phase = "params"
        return True

    def _read_after(self, out: ParsedDelta) -> bool | str | None:
        i, tag = find_first(self._buf, _AFTER_TAGS)
        if tag is None:
            self._buf = self._buf[len(self._buf) - partial_tag_len(self._buf, _AFTER_TAGS):]
            return None
        if tag == CALL_END:
            return self._buf[i + len(tag):]
        self._buf = self._buf[i:]  # a second function in the same <tool_call>: a call of its own
        self._phase = "function"
        return True

    def _finish_call(self, out: ParsedDelta) -> None:
        if self._phase == "function":
            self._content(out, self._opening + self._buf)
        elif self._phase == "value":  # cut off inside a value: what there is of it, unclosed
            piece = self._buf
            if not self._value_started:
                piece = piece.removeprefix("\n")
            if self._is_string:
                self._arguments(out, json.dumps(piece, ensure_ascii=False)[1:-1])
            else:
                self._arguments(out, self._typed_text + piece)

    def _string_typed(self, param: str) -> bool:
        """Whether the function's schema leaves `param` a string (an unknown parameter is one)."""
        spec = self.tools.get(self._name, {}).get("properties", {}).get(param)
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind is None:
            return True
        return "string" in kind if isinstance(kind, list) else kind == "string"

    @staticmethod
    def _typed(text: str) -> object:
        """A non-string parameter's value: its JSON reading (numbers, booleans, objects, arrays,
        null; Python's True / False too), else the text itself."""
        text = text.strip()
        try:
            return json.loads(text.lower() if text in ("True", "False") else text)
        except json.JSONDecodeError:
            return text
