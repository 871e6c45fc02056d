"""Which data-parallel replica serves a request: the one whose prefix cache most likely holds the
start of its prompt, unless that one is much busier than the least-loaded replica.

Why prefix-aware: every replica has a prefix cache of its own, so a prompt that shares a long start
with an earlier one (a system prompt, a conversation's earlier turns) is prefilled again in full on
any other replica. Why the load margin: sending every such prompt to one replica would queue them
there while the others idle.

The router cannot see the replicas' caches (they live in other processes and change every step), so
it keeps its own picture: a table from block hash to the replica most recently sent a prompt with
that block. Hashes chain over `block_size`-token blocks exactly as the engine's prefix cache chains
them (kv_cache.py), so one hash stands for the whole prompt up to its block's end and the longest
match is the last hit of a walk from the first block. The table is a least-recently-used map bounded
by the replicas' KV blocks in all: more entries than their caches hold would point at long-evicted
blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hotpath.engine.kv_cache import _chain_hash

DEFAULT_LOAD_MARGIN = 4  # requests in flight a prefix match may cost over the least-loaded replica


@dataclass(frozen=True)
class Route:
    replica: int
    matched_blocks: int  # prompt blocks the chosen replica was last sent (0: routed by load alone)


class PrefixRouter:
    """The routing rule and its table; pure bookkeeping, driven by the data-parallel front."""

    def __init__(self, num_replicas: int, block_size: int, capacity: int,
                 load_margin: int = DEFAULT_LOAD_MARGIN) -> None:
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {num_replicas}")
        if block_size < 1 or capacity < 1 or load_margin < 0:
            raise ValueError(f"block_size ({block_size}) and capacity ({capacity}) must be positive, "
                             f"load_margin ({load_margin}) not negative")
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.capacity = capacity
        self.load_margin = load_margin
        self.routed = [0] * num_replicas  # requests sent to each replica
        self.prefix_routed = [0] * num_replicas  # of those, sent for a prefix match
        self._table: OrderedDict[int, int] = OrderedDict()  # block hash -> replica, oldest first

    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The chained hashes of the prompt's full blocks (a partial last block is never cached)."""
        hashes, parent, bs = [], None, self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            parent = _chain_hash(parent, tuple(token_ids[start:start + bs]))
            hashes.append(parent)
        return hashes

    def choose(self, hashes: Sequence[int], loads: Sequence[int]) -> Route:
        """The replica for a prompt with these block hashes, given each replica's requests in flight.

        The replica last sent the longest matching prefix wins unless its load exceeds the least
        loaded one's by more than `load_margin`; otherwise (and with no match) the least-loaded
        replica, ties going to the one sent fewest requests so far, so idle replicas take turns."""
        if len(loads) != self.num_replicas:
            raise ValueError(f"expected {self.num_replicas} loads, got {len(loads)}")
        least = min(range(self.num_replicas), key=lambda i: (loads[i], self.routed[i], i))
        matched, holder = 0, None
        for h in hashes:
            replica = self._table.get(h)
            if replica is None:
                break  # chained: no later block can match once one does not
            matched, holder = matched + 1, replica
        if holder is not None and loads[holder] <= loads[least] + self.load_margin:
            return Route(holder, matched)
        return Route(least, 0)

    def record(self, hashes: Sequence[int], route: Route) -> None:
        """Notes that the replica was sent this prompt: its blocks now point there."""
        self.routed[route.replica] += 1
        if route.matched_blocks:
            self.prefix_routed[route.replica] += 1
        for h in hashes:
            self._table[h] = route.replica
            self._table.move_to_end(h)
        while len(self._table) > self.capacity:
            self._table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)
