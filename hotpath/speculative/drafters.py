"""Drafters: what proposes the tokens a verify step checks. The n-gram drafter, here, runs on the
engine beside the policy; those that run a model run on the workers (model_drafters.py).

A drafter sets `seq.draft_token_ids` (at most the number of draft slots the scheduler reserved)
and `seq.draft_probs`, the distribution each draft was drawn from ([k, vocab] float32 on the
device; None where drafts are point masses, as n-gram lookups are). Verification
(hotpath/speculative/rejection.py) makes the output exactly the target's whatever a drafter proposes;
a drafter only decides how many tokens a step gains.
"""

from __future__ import annotations

import numpy as np

from hotpath.runner.seq_state import SeqState
from hotpath.runner.step_types import LaunchedStep
from hotpath.speculative.config import SpeculativeConfig
from hotpath.speculative.ngram import ngram_propose


class Drafter:
    """What every drafter answers; the defaults are a drafter that keeps nothing between steps."""

    def propose(self, seqs: list[SeqState], slots: list[int]) -> None:
        """Drafts for each decoding sequence, at most slots[i] of them."""
        raise NotImplementedError

    def behind(self, seqs: list[SeqState]) -> int:
        """The tokens propose() would run through before drafting for seqs."""
        return 0

    def collected(self, step: LaunchedStep, gone: set[int]) -> None:
        """A step's tokens reached the host (and were appended); `gone`: sequences finished or
        preempted since it was launched."""

    def forget(self, seq: SeqState) -> None:
        """seq finished."""


class NgramDrafter(Drafter):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        # seq_id -> (its tokens so far in an array with room to grow, how many): built once and
        # appended to, not converted from the token list every step (O(context) a sequence)
        self.contexts: dict[int, tuple[np.ndarray, int]] = {}

    def propose(self, seqs: list[SeqState], slots: list[int]) -> None:
        for seq, k in zip(seqs, slots):
            seq.draft_token_ids = ngram_propose(self._context(seq), k, self.min_n, self.max_n)
            seq.draft_probs = None

    def _context(self, seq: SeqState) -> np.ndarray:
        buf, n = self.contexts.get(seq.seq_id, (np.empty(0, dtype=np.int64), 0))
        total = seq.num_known_tokens
        if total > len(buf):
            grown = np.empty(max(2 * len(buf), total + 256), dtype=np.int64)
            grown[:n] = buf[:n]
            buf = grown
        prompt = len(seq.prompt_token_ids)
        if n < prompt:
            buf[n:prompt] = seq.prompt_token_ids[n:]
            n = prompt
        buf[n:total] = seq.output_token_ids[n - prompt :]
        self.contexts[seq.seq_id] = (buf, total)
        return buf[:total]

    def forget(self, seq: SeqState) -> None:
        self.contexts.pop(seq.seq_id, None)
