"""Step plans (runner/plan.py) from the engine's sequences: what the workers do not hold yet, and
each scheduled sequence's row."""

from __future__ import annotations

from hotpath.engine.sequence import Sequence
from hotpath.runner.plan import NewSeq, RowPlan, StepPlan


class PlanBuilder:
    def __init__(self) -> None:
        self._forget: list[int] = []  # finished sequences the workers still hold

    def forget(self, seq: Sequence) -> None:
        """seq finished: the next plan tells the workers to drop it."""
        if seq.on_workers:
            self._forget.append(seq.seq_id)
            seq.on_workers = False

    def plan(self, scheduled: list[tuple[Sequence, int]], uses_prev: bool = False) -> StepPlan:
        """The plan of a step that feeds each sequence its next n tokens (drafts last); marks what
        the plan hands over as held by the workers. A sequence's one-step fields (the snapshot it
        restores, where it saves one) go with this plan only."""
        new = []
        rows = []
        for seq, n in scheduled:
            if not seq.on_workers:
                seed = None if seq.params.seed is None else seq.params.seed + seq.index
                new.append(NewSeq(seq.seq_id, seq.prompt_token_ids, seq.output_token_ids, seq.params,
                                  seq.max_tokens, sorted(seq.stop_token_ids), seed, seq.num_pending_tokens,
                                  seq.mm_items))
                seq.on_workers, seq.num_blocks_sent = True, 0
            sent = seq.num_blocks_sent
            rows.append(RowPlan(seq.seq_id, n, seq.num_computed_tokens, sent, seq.block_table[sent:],
                                seq.state_slot, seq.restore_snapshot, seq.save_at, seq.draft_token_ids))
            seq.num_blocks_sent = len(seq.block_table)
        forget, self._forget = self._forget, []
        return StepPlan(new, rows, forget, uses_prev)

    def step_plan(self, scheduled: list[tuple[Sequence, int]], uses_prev: bool) -> StepPlan:
        plan = self.plan(scheduled, uses_prev)
        for seq, _ in scheduled:
            seq.restore_snapshot = seq.save_at = None
        return plan
