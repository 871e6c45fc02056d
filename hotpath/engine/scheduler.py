"""Continuous batching with chunked prefill under a per-step token budget.

Each step:
1. Running sequences, in admission order, get their next tokens: one for a decode, a chunk for an
   unfinished prefill. A sequence is admitted only with budget left after every running one, so a
   sequence still prefilling is behind every running decode: a long prompt never starves them; it
   takes what the decodes leave, chunk by chunk. When the cache has no block for a sequence, the
   most recently admitted sequence is preempted (its blocks freed; it is recomputed later from its
   tokens).
   Under async scheduling a step is scheduled while the previous one runs: a sequence's newest
   token may still be pending on the device (counted by num_tokens all the same), and one whose
   pending token is its max_tokens-th is skipped, as it will finish when that token arrives.
   With speculative decoding a decoding sequence takes 1 + its draft slots (its last token and
   the drafts a verify step checks), in blocks and in budget.
2. If nothing was preempted, waiting sequences are admitted in arrival order while the budget, the
   free blocks and max_num_seqs allow, reusing prefix-cached blocks. A sequence whose structured
   output grammar is still compiling (hotpath/structured) is passed over, keeping its place.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hotpath.config import EngineConfig
from hotpath.engine.kv_cache import KVCacheManager
from hotpath.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, kv_cache: KVCacheManager,
                 num_draft_slots: Callable[[Sequence], int] | None = None, draft_room: int = 0) -> None:
        self.config = config
        self.kv_cache = kv_cache
        # speculative decoding: how many drafts a decoding sequence may verify this step (its
        # blocks and token budget are reserved for them; the drafter may propose fewer)
        self.num_draft_slots = num_draft_slots
        # blocks a decoding sequence holds room for, in tokens from its last one, whatever this
        # step's drafts (1 + K): a verify graph's rows are that long, rows with fewer drafts padded
        self.draft_room = draft_room
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending_tokens and seq.num_output_tokens >= seq.max_tokens:
                i += 1  # its last token is being sampled already (async scheduling)
                continue
            num_new = room = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if self.num_draft_slots is not None and seq.is_decoding:
                num_new = min(1 + self.num_draft_slots(seq), budget)
                room = max(num_new, self.draft_room)
            if not self._allocate_or_preempt(seq, room, out):
                break  # seq itself was preempted, and it was the last running one
            out.scheduled.append((seq, num_new))
            budget -= num_new
            i += 1

        if out.preempted:
            return out
        compiling = []  # sequences whose grammar is compiling keep their place, admitted once it is done
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.grammar is not None and not seq.grammar.ready:
                compiling.append(self.waiting.popleft())
                continue
            cached = self.kv_cache.find_cached_prefix(seq) if seq.num_computed_tokens == 0 else []
            num_computed = seq.num_computed_tokens + len(cached) * self.kv_cache.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.kv_cache.allocate(seq, num_new, cached):
                break
            if not seq.output_token_ids:
                seq.num_cached_prompt_tokens = num_computed
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(compiling))
        return out

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        while not self.kv_cache.allocate(seq, num_new):
            victim = self.running.pop()  # the most recently admitted, never one scheduled already
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED
