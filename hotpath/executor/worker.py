"""A worker: one rank's model runner, the sequences it holds, and its model-running drafter.

The engine's executor hands it step plans (runner/plan.py). It keeps a SeqState per sequence,
created from the plan's NewSeq entries and updated from its rows; the tokens it samples it appends
itself as it collects them, as the engine does with the same tokens, so both sides hold the same
token lists. Every rank of a tensor-parallel group runs the same plans and samples the same tokens
(their logits are gathered whole on each rank, and their generators are seeded alike); rank 0's
are the ones the engine reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotpath.distributed.parallel_state import SINGLE, Parallel, building_parallel
from hotpath.multimodal.positions import MropeLayout
from hotpath.resolve import Resolved
from hotpath.runner.model_runner import ModelRunner
from hotpath.runner.step_types import LaunchedStep
from hotpath.runner.plan import NewSeq, SampledToken, StepPlan
from hotpath.runner.seq_state import SeqState
from hotpath.structured.bitmask import TokenMask


@dataclass
class WorkerInfo:
    """What the engine needs to know of the runner: cache capacity and the step shapes it replays."""

    num_blocks: int
    num_state_slots: int
    num_snapshots: int
    stateful: bool  # the model has linear-attention layers (state slots, snapshots, rollback)
    graph_sizes: list[int]  # decode graphs' batch sizes, ascending; empty: every step eager
    kv_cache_dtype: str


class Worker:
    def __init__(self, resolved: Resolved, parallel: Parallel = SINGLE) -> None:
        spec = resolved.spec
        with building_parallel(parallel):
            self.runner = ModelRunner(
                resolved.model_config, resolved.config, resolved.model_dir, resolved.args.load_format,
                resolved.device, resolved.dtype, resolved.args.seed, resolved.args.enforce_eager,
                (resolved.draft.config, resolved.draft.model_dir) if resolved.draft else None,
                resolved.num_speculative_tokens, mtp=spec is not None and spec.method == "mtp",
            )
        self.drafter = None
        if spec is not None and spec.method != "ngram":
            from hotpath.speculative.model_drafters import make_drafter

            self.drafter = make_drafter(spec, self.runner, resolved.config.max_num_batched_tokens)
        self.seqs: dict[int, SeqState] = {}
        # seq_id -> its sampling generator: kept across a preemption (its NewSeq comes again), so a
        # seeded sequence continues its random stream as it would have
        self.generators: dict[int, torch.Generator] = {}
        self.steps: dict[int, LaunchedStep] = {}  # launched and not collected, by step id
        self.next_step = 0
        torch.manual_seed(resolved.args.seed)  # unseeded sampling: the same stream on every rank

    def info(self) -> WorkerInfo:
        r = self.runner
        return WorkerInfo(r.num_blocks, r.num_state_slots, r.num_snapshots, bool(r.state_layers),
                          sorted(r.graphs), str(r.kv_cache_dtype).removeprefix("torch."))

    # ---- plans --------------------------------------------------------------------------
    def _apply(self, plan: StepPlan) -> list[tuple[SeqState, int]]:
        """Brings the sequences up to the plan; returns the scheduled (state, tokens) rows."""
        for seq_id in plan.forget:
            seq = self.seqs.pop(seq_id, None)
            self.generators.pop(seq_id, None)
            if seq is not None and self.drafter is not None:
                self.drafter.forget(seq)
        for new in plan.new:
            self.seqs[new.seq_id] = self._state(new)
        scheduled = []
        for row in plan.rows:
            seq = self.seqs[row.seq_id]
            seq.num_computed_tokens = row.num_computed_tokens
            if row.blocks or row.blocks_from != len(seq.block_table):
                del seq.block_table[row.blocks_from:]
                seq.block_table += row.blocks
            seq.state_slot = row.state_slot
            seq.restore_snapshot = row.restore_snapshot
            seq.save_at = row.save_at
            if row.drafts != seq.draft_token_ids:  # drafts of the engine's (n-gram): point masses
                seq.draft_token_ids, seq.draft_probs = list(row.drafts), None
            scheduled.append((seq, row.num_new))
        return scheduled

    def _state(self, new: NewSeq) -> SeqState:
        gen = self.generators.get(new.seq_id)
        if gen is None and new.seed is not None:
            gen = torch.Generator(device=self.runner.device).manual_seed(new.seed)
            self.generators[new.seq_id] = gen
        # the prompt list is shared, never copied: no side changes a prompt (the outputs are each side's)
        state = SeqState(seq_id=new.seq_id, prompt_token_ids=new.prompt_token_ids,
                         output_token_ids=list(new.output_token_ids), params=new.params,
                         num_pending_tokens=new.num_pending_tokens, max_tokens=new.max_tokens,
                         stop_token_ids=set(new.stop_token_ids), generator=gen, mm_items=new.mm_items)
        mm = self.runner.model_config.multimodal
        if new.mm_items and mm is not None:
            state.mrope = MropeLayout(new.mm_items, mm.spatial_merge_size)
            state.rope_delta = state.mrope.rope_delta
        return state

    # ---- the executor's calls -----------------------------------------------------------
    def launch(self, plan: StepPlan) -> int:
        """Queues the plan's step on the device; returns its id for collect."""
        scheduled = self._apply(plan)
        prev = self.steps.get(self.next_step - 1) if plan.uses_prev else None
        assert not plan.uses_prev or prev is not None, "a pending input token without its step"
        step = self.runner.launch(scheduled, prev, plan.mask_follows)
        for seq in step.sampling:
            seq.num_pending_tokens += 1
        self.steps[self.next_step] = step
        self.next_step += 1
        return self.next_step - 1

    def sample(self, step_id: int, mask: TokenMask) -> None:
        """Samples a step launched with mask_follows, its token mask applied (structured output)."""
        self.steps[step_id] = self.runner.sample(self.steps[step_id], mask)

    def collect(self, step_id: int, gone: list[int]) -> dict[int, list[SampledToken]]:
        """Waits for a step's tokens and appends them to its sequences; `gone`: sequences the
        engine finished or preempted since the step was launched (no drafter catches up on them)."""
        step = self.steps.pop(step_id)
        tokens = self.runner.collect(step)
        kept = []  # a hybrid's verify rows: the tokens each kept (accepted drafts + 1)
        for seq in step.sampling:
            got = tokens[seq.seq_id]
            seq = self.seqs.get(seq.seq_id, seq)  # sent again since (preempted), or finished
            seq.num_pending_tokens -= 1
            if seq.draft_token_ids:
                kept.append((seq, len(got)))
                seq.num_computed_tokens -= len(seq.draft_token_ids) + 1 - len(got)
                seq.draft_token_ids, seq.draft_probs = [], None
            if len(got) == 1:
                seq.output_token_ids.append(got[0].token_id)
            else:
                seq.output_token_ids += [t.token_id for t in got]
        if kept and self.runner.state_layers:  # the linear-attention state back to the last kept token
            self.runner.rollback_states(kept)
        if self.drafter is not None:
            self.drafter.collected(step, set(gone))
        return tokens

    def propose(self, plan: StepPlan) -> dict[int, tuple[list[int], int]]:
        """Drafts for the plan's rows, at most row.num_new - 1 each: {seq_id: (drafts, tokens the
        drafter has seen)}."""
        scheduled = self._apply(plan)
        seqs = [seq for seq, _ in scheduled]
        self.drafter.propose(seqs, [n - 1 for _, n in scheduled])
        return {seq.seq_id: (list(seq.draft_token_ids), seq.num_draft_computed) for seq in seqs}
