"""The layers a checkpoint leaves unquantized, by name: fp8's `ignored_layers` /
`modules_to_not_convert` and compressed-tensors' `ignore` (exact module names, or `re:` regular
expressions), AWQ's `modules_to_not_convert` (parts of names: ["visual"] skips a vision tower)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable


class IgnoreList:
    def __init__(self, entries: Iterable[str], substrings: bool = False) -> None:
        self.entries = [str(e) for e in entries]  # as the checkpoint names its modules
        self.substrings = substrings
        self._names = list(self.entries)  # as the model names them (map_names)

    def _matches(self, name: str) -> bool:
        for entry in self._names:
            if entry.startswith("re:"):
                if re.match(entry[3:], name):
                    return True
            elif entry == name or (self.substrings and entry in name):
                return True
        return False

    def skips(self, module_name: str, shard_names: list[str]) -> bool:
        """Whether the layer (named `module_name`, its checkpoint projections `shard_names`) is
        left unquantized; a fused layer whose projections disagree cannot load."""
        if self._matches(module_name):
            return True
        matched = [self._matches(n) for n in shard_names]
        if any(matched) and not all(matched):
            raise ValueError(
                f"the checkpoint leaves {[n for n, m in zip(shard_names, matched) if m]} unquantized "
                f"but not {[n for n, m in zip(shard_names, matched) if not m]}, which hotpath "
                "runs as one fused layer")
        return bool(shard_names) and all(matched)

    def map_names(self, to_model_name: Callable[[str], str | None]) -> None:
        """Matches exact entries as `to_model_name` renames the checkpoint's module names to the
        model's (a composite checkpoint nests its text model); entries for modules the model
        lacks are dropped."""
        mapped = []
        for entry in self.entries:
            if entry.startswith("re:") or self.substrings:
                mapped.append(entry)
            elif (name := to_model_name(entry + ".weight")) is not None:
                mapped.append(name.removesuffix(".weight"))
        self._names = mapped
