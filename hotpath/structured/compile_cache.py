"""Compiled grammars by constraint: compiled on a thread pool, off the engine's loop, and kept in a
bounded least-recently-used table, so requests that repeat a schema (an agent's tools, a form)
compile it once."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Compiled = TypeVar("Compiled")


class CompileCache(Generic[Compiled]):
    def __init__(self, compile: Callable[[str], Compiled], max_entries: int = 256, workers: int = 1) -> None:
        self._compile = compile
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Future[Compiled]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hotpath-grammar")

    def get(self, key: tuple[str, str]) -> Future[Compiled] | None:
        """The compile of `key` ((kind, spec)), done or under way; None if it is not held."""
        future = self._entries.get(key)
        if future is not None:
            self._entries.move_to_end(key)
        return future

    def submit(self, key: tuple[str, str], grammar: str) -> Future[Compiled]:
        """Starts compiling `grammar` on the pool, held under `key`; the least recently used entry
        goes past max_entries (a sequence keeps what it holds)."""
        future = self._pool.submit(self._compile, grammar)
        self._entries[key] = future
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return future

    def drop(self, key: tuple[str, str]) -> None:
        """Forgets a compile that failed, so a later request tries again."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
