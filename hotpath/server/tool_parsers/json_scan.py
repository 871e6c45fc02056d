"""Where a JSON value ends, found as its text streams in, so that tool-call arguments can be passed
on as they come and cut exactly where the value closes."""

from __future__ import annotations

_SCALAR_END = frozenset(",}] \t\r\n")


class JsonValueScanner:
    """Reads one JSON value chunk by chunk (leading whitespace skipped); `feed` returns the index
    in the chunk just past the value once it is complete. Only the nesting and the strings are
    tracked, not the grammar: it finds the end of a well-formed value, and of most malformed ones."""

    def __init__(self) -> None:
        self.started = False
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.scalar = False  # a bare number / true / false / null, which ends at a delimiter

    def feed(self, text: str) -> int | None:
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
                if ch == '"':
                    self.in_string = True
                elif ch in "{[":
                    self.depth = 1
                else:
                    self.scalar = True
                continue
            if self.scalar:
                if ch in _SCALAR_END:
                    return i
            elif self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None
