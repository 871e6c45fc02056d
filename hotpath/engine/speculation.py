"""Speculative decoding's engine side: each step's number of drafts (the policy), the draft slots
the scheduler reserves, and the drafts themselves: looked up here (n-gram), or asked of the
workers, whose runner holds the draft model or MTP head (executor.propose)."""

from __future__ import annotations

import time

from hotpath.engine.plans import PlanBuilder
from hotpath.engine.sequence import Sequence
from hotpath.runner.plan import SPEC_GRAPH_MAX_ROWS
from hotpath.speculative.config import SpeculativeConfig
from hotpath.speculative.drafters import Drafter, NgramDrafter
from hotpath.speculative.policy import CATCH_UP_TIMED, DraftLengthPolicy
from hotpath.speculative.stats import SpecStats


class WorkerDrafter(Drafter):
    """A model-running drafter on the workers: proposes through the executor, and remembers how
    far each sequence's draft model has caught up (what `behind` counts)."""

    def __init__(self, executor, plans: PlanBuilder, counts_behind: bool) -> None:
        self.executor = executor
        self.plans = plans
        self.counts_behind = counts_behind  # a draft model catches up on the tokens it has not seen

    def propose(self, seqs: list[Sequence], slots: list[int]) -> None:
        drafts = self.executor.propose(self.plans.plan([(seq, 1 + k) for seq, k in zip(seqs, slots)]))
        for seq in seqs:
            tokens, seq.num_draft_computed = drafts[seq.seq_id]
            seq.draft_token_ids = list(tokens)

    def behind(self, seqs: list[Sequence]) -> int:
        return sum(seq.num_tokens - seq.num_draft_computed for seq in seqs) if self.counts_behind else 0


class Speculation:
    def __init__(self, config: SpeculativeConfig, executor, plans: PlanBuilder) -> None:
        self.config = config
        self.policy = DraftLengthPolicy(config.num_speculative_tokens, config.adaptive)
        self.stats = SpecStats(config.num_speculative_tokens)
        self.drafter: Drafter = NgramDrafter(config) if config.method == "ngram" else WorkerDrafter(
            executor, plans, counts_behind=config.method == "draft_model")
        self._step_drafts = 0  # the drafts this step's decoding sequences may verify
        self._rows_left = 0  # sequences this step may still give draft slots

    def begin_step(self, running: list[Sequence], waiting: bool) -> None:
        """Chooses the step's number of drafts (before the scheduler reserves their slots)."""
        decoding = [s for s in running if s.is_decoding]
        prefilling = len(decoding) < len(running) or waiting
        self._step_drafts = self.policy.choose(decoding, prefilling, self.drafter.behind(decoding))
        self._rows_left = SPEC_GRAPH_MAX_ROWS

    def num_draft_slots(self, seq: Sequence) -> int:
        """Drafts a decoding sequence may verify this step: the step's k, fewer near max_tokens
        (a step emits at most drafts + 1 tokens), none past SPEC_GRAPH_MAX_ROWS sequences, none
        for a sequence with structured output (its tokens follow a grammar one at a time)."""
        if self._rows_left <= 0 or seq.grammar is not None:
            return 0
        slots = max(0, min(self._step_drafts, seq.max_tokens - seq.num_output_tokens - 1))
        self._rows_left -= slots > 0
        return slots

    def timed(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Whether the step's time tells the policy something: a pure decode step, unless a
        drafter first catches up on a whole prompt."""
        far = max((self.drafter.behind([seq]) for seq, n in scheduled if n > 1), default=0)
        return (bool(scheduled) and all(seq.is_decoding for seq, _ in scheduled)
                and far <= 1 + self.config.num_speculative_tokens)

    def propose(self, scheduled: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """Drafts for the decoding sequences given draft slots; each then feeds its last token
        and its drafts (the drafter may propose fewer than its slots, or none)."""
        drafting = [(seq, n - 1) for seq, n in scheduled if n > 1 and seq.is_decoding]
        if not drafting:
            return scheduled
        seqs = [seq for seq, _ in drafting]
        behind, start = self.drafter.behind(seqs), time.perf_counter()
        self.drafter.propose(seqs, [k for _, k in drafting])  # ends with the drafts on the host
        if behind >= CATCH_UP_TIMED:  # a long catch-up (a prompt): its cost a token, for the policy
            self.policy.record_catch_up(behind, time.perf_counter() - start)
        for seq in seqs:
            if not seq.draft_token_ids:  # slots that gained nothing (no n-gram match)
                self.policy.record_no_drafts(seq)
        ids = {seq.seq_id for seq in seqs}
        return [(seq, 1 + len(seq.draft_token_ids)) if seq.seq_id in ids else (seq, n) for seq, n in scheduled]

    def verified(self, seq: Sequence, drafts: int, accepted: int, appended: int) -> None:
        """A verify row's outcome: `accepted` of its `drafts`, `appended` tokens reached the output."""
        self.policy.record_acceptance(seq, drafts, accepted)
        seq.num_drafted += drafts
        seq.num_accepted += min(accepted, appended)  # counted as accepted: drafts that reached the output
        self.stats.record(drafts, min(accepted, appended))

    def forget(self, seq: Sequence) -> None:
        self.policy.forget(seq)
        self.drafter.forget(seq)
