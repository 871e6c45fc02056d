"""Snapshots of a hybrid model's linear-attention state, so that prefix caching works for it.

A KV prefix hit skips tokens; a linear-attention layer cannot skip them, it needs its state as it
was after them. So the state is copied, as a snapshot, at block boundaries, and registered under
the hash of the block that ends there (the KV prefix cache's chain): a hit is then cut back to the
longest cached prefix whose last block has a snapshot, which is copied into the sequence's slot.

Which boundaries: each running sequence owns one pending snapshot, overwritten with its state at
every block boundary its steps reach (a step's chunk that spans several keeps the last). It is
registered, and the sequence takes a new pending one, when the sequence moves on past a boundary
that is a multiple of the stride (`stride_blocks` blocks) or the prompt's last (a repeated system
prompt); and when the sequence finishes or is preempted (its last boundary: the multi-turn case,
whose next prompt begins with this prompt and output). Registered snapshots are evicted least-recently-used, and
with the KV block they are keyed by.

This class holds ids and bookkeeping; the runner holds the tensors and copies.
"""

from __future__ import annotations

from collections import OrderedDict

from hotpath.engine.sequence import Sequence


class StateSnapshots:
    def __init__(self, num_snapshots: int, block_size: int, stride_blocks: int) -> None:
        self.block_size = block_size
        self.stride_blocks = stride_blocks
        self.free_ids: list[int] = list(range(num_snapshots))
        self.registered: OrderedDict[int, int] = OrderedDict()  # block hash -> id, LRU first

    def lookup(self, hashes: list[int]) -> int:
        """How many of a prefix hit's blocks (their hashes, in order) can be used: up to the last
        one that has a snapshot (0: none)."""
        for j in range(len(hashes), 0, -1):
            if hashes[j - 1] in self.registered:
                return j
        return 0

    def restore_id(self, block_hash: int) -> int:
        self.registered.move_to_end(block_hash)
        return self.registered[block_hash]

    def plan_save(self, seq: Sequence, start: int, end: int, keep: set[int]) -> None:
        """For a step bringing seq's tokens [start, end): if a block boundary falls in (start, end],
        save the state there (the last such) into seq's pending snapshot. `keep`: ids this step
        restores from, not to be evicted for a pending one."""
        boundary = end // self.block_size * self.block_size
        if boundary <= start or boundary == 0:
            return
        held = seq.snapshot_boundary
        if seq.snapshot is not None and (self._is_stride(held) or held <= len(seq.prompt_token_ids) < boundary):
            self._register(seq)  # keep a stride's or the prompt's last boundary; take a new one
        if seq.snapshot is None:
            seq.snapshot = self._take(keep)
            if seq.snapshot is None:
                return  # every snapshot in use: this boundary goes unsaved
        seq.snapshot_boundary = boundary
        seq.save_at = (boundary - start, seq.snapshot)

    def release(self, seq: Sequence) -> None:
        """seq finishes or is preempted: register its pending snapshot (its last boundary)."""
        if seq.snapshot is not None:
            self._register(seq)

    def forget_block(self, block_hash: int) -> None:
        """The KV block keyed by block_hash is evicted: its snapshot can no longer be reached."""
        snap = self.registered.pop(block_hash, None)
        if snap is not None:
            self.free_ids.append(snap)

    def _is_stride(self, boundary: int) -> bool:
        return boundary // self.block_size % self.stride_blocks == 0

    def _register(self, seq: Sequence) -> None:
        snap, blocks = seq.snapshot, seq.snapshot_boundary // self.block_size
        seq.snapshot, seq.snapshot_boundary = None, 0
        if len(seq.block_hashes) < blocks:  # the boundary's block was never full of known tokens
            self.free_ids.append(snap)
            return
        block_hash = seq.block_hashes[blocks - 1]
        old = self.registered.pop(block_hash, None)
        if old is not None:
            self.free_ids.append(old)
        self.registered[block_hash] = snap

    def _take(self, keep: set[int]) -> int | None:
        if self.free_ids:
            return self.free_ids.pop()
        for block_hash, snap in self.registered.items():  # least recently used first
            if snap not in keep:
                del self.registered[block_hash]
                return snap
        return None
