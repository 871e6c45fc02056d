"""ModelRunner: turns a scheduled step into batch tensors, runs the model, samples.

It owns the model, the KV cache tensors and the sampler. The engine hands it
(sequence, num_new_tokens) pairs and gets back one sampled token per sequence whose tokens are
all computed after this step (a prefill's last chunk, or a decode), in two halves: `launch`
queues the step on the device and returns at once, `collect` waits for its tokens. Between the two
the engine may schedule and launch the next decode step, its input tokens read from this step's
sampled ids on the device (async scheduling).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

from hotpath.config import EngineConfig, ModelConfig
from hotpath.layers.cache import KVCacheSpec, StateCacheSpec
from hotpath.loader.model_loader import load_model, load_mtp
from hotpath.ops.attention import DECODE_MAX_QUERY_LEN
from hotpath.ops.backend import use_triton
from hotpath.ops.quant import fp8_dtype
from hotpath.runner.decode_inputs import DecodeInputs
from hotpath.layers.forward_batch import ForwardBatch
from hotpath.runner.row_graphs import GRAPH_BATCH_SIZES, RowGraphs, context_buckets, graph_forward
from hotpath.runner.plan import SPEC_GRAPH_MAX_ROWS, SampledToken, decode_graph_size
from hotpath.runner.sampler import Sampler
from hotpath.runner.seq_state import SeqState, is_plain_greedy

logger = logging.getLogger(__name__)


@dataclass
class LaunchedStep:
    """A step queued on the device whose sampled tokens are on their way to the host."""

    scheduled: list[tuple[SeqState, int]]
    sampling: list[SeqState]  # the sequences that sample, in row order
    token_ids: torch.Tensor | None  # [len(sampling)] int64 on the device: the next step's inputs
    host: list[torch.Tensor | None]  # token ids, logprobs, top ids, top logprobs, copied to the host
    done: torch.cuda.Event | None  # recorded after those copies (None off CUDA: already there)
    out_slot: int | None = None  # the decode inputs' host ring row `host` views, freed on collect
    verified: dict[int, list[SampledToken]] | None = None  # a verify step's tokens, on the host
    # with an MTP head: the target's final hidden states of the step's tokens [tokens, hidden], and
    # where each sequence's are: (sequence, first position, tokens, first row in `hidden`)
    hidden: torch.Tensor | None = None
    hidden_rows: list[tuple[SeqState, int, int, int]] | None = None

    def rows_of(self, seqs: list[SeqState]) -> list[int]:
        """The rows that sampled these sequences' tokens in this step."""
        rows = {s.seq_id: i for i, s in enumerate(self.sampling)}
        return [rows[s.seq_id] for s in seqs]


class Row(NamedTuple):
    """A sequence's tokens in one forward: `tokens` at positions first, first + 1, ... over its
    block table, logits wanted for the last `num_logits` of them."""

    seq: SeqState
    first: int
    tokens: list[int]
    num_logits: int


class Replayable(Protocol):
    def replay(self) -> None: ...


# Longest contexts of the extra decode graphs captured for short contexts. A graph's attention
# spreads each context over a number of programs fixed from the longest it may meet
# (max_model_len), and at a fraction of that most find no keys and still cost: Qwen3-0.6B at
# batch 1 and 532 tokens, 719 us a step in a graph sized for 40,960 tokens (66 splits) against
# 572 in one sized for 1,024 (16; H200, run N). So a batch size also gets a graph for each of
# these contexts below max_model_len that at least halves its splits; a step takes the smallest
# that holds its longest context.
SHORT_CONTEXT_GRAPHS = (1024, 2048)

# records a decode forward once: (something to replay it with, its logits output tensor)
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replayable, torch.Tensor]]


def state_slots_that_fit(max_num_seqs: int, bytes_per_slot: int, snapshots: bool, budget: float) -> int:
    """Hybrid models' state slots: one per sequence up to max_num_seqs, as many snapshots again
    with prefix caching, and a scratch slot, in at most half of `budget` bytes (the rest is for
    the KV blocks)."""
    copies = 2 if snapshots else 1
    slots = min(max_num_seqs, int(budget / 2 / bytes_per_slot - 1) // copies)
    if slots < 1:
        raise ValueError(
            f"no memory left for even one sequence's linear-attention state ({bytes_per_slot / 2**20:.0f} MB) "
            "after loading the model; raise gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return slots


def _capture_cuda_graph(forward: Callable[[], torch.Tensor], pool: tuple) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    forward()  # warm up: Triton compiles and autotunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits = forward()
    torch.cuda.synchronize()
    return graph, logits


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        model_dir: Path,
        load_format: str,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
        enforce_eager: bool = False,
        draft: tuple[ModelConfig, Path] | None = None,
        num_speculative_tokens: int = 0,
        mtp: bool = False,
    ) -> None:
        self.model_config = model_config
        self.engine_config = engine_config
        self.device = device
        self.dtype = dtype
        self.model = load_model(
            model_config, model_dir, load_format, device, dtype, engine_config.max_model_len, seed
        )
        # speculative decoding's draft model: its K/V blocks are the target's block ids in
        # tensors of its own, sized and allocated with the target's (speculative/drafters.py)
        self.draft_model = None if draft is None else load_model(
            draft[0], draft[1], load_format, device, dtype, engine_config.max_model_len, seed + 1)
        # speculative decoding's multi-token-prediction head (models/mtp.py): the checkpoint's
        # mtp.* layer on the target's embedding and LM head, its K/V beside the target's
        self.mtp = None if not mtp else load_mtp(
            model_config, model_dir, load_format, device, dtype, engine_config.max_model_len, seed + 1, self.model)
        self.num_speculative_tokens = num_speculative_tokens  # K: verify graphs take rows of 1 + K
        self.block_size = engine_config.block_size
        # K and V in the model dtype, or in fp8 (half bf16's bytes a token: twice the blocks fit)
        self.kv_cache_dtype = fp8_dtype(device) if engine_config.kv_cache_dtype == "fp8" else dtype
        layers = self.model.cache_layers()
        for extra in (self.draft_model, self.mtp):
            if extra is not None:
                layers = layers + extra.cache_layers()
        self.kv_layers = [layer for layer in layers if isinstance(layer.cache_spec(), KVCacheSpec)]
        # the target's linear-attention layers (hybrid models), and a hybrid draft model's
        self.state_layers = [layer for layer in self.model.cache_layers()
                             if isinstance(layer.cache_spec(), StateCacheSpec)]
        self.draft_state_layers = [] if self.draft_model is None else [
            layer for layer in self.draft_model.cache_layers() if isinstance(layer.cache_spec(), StateCacheSpec)]
        # a state slot per sequence the scheduler may run at once, each freed when its sequence
        # finishes or is preempted (hybrid models; none otherwise); fewer where max_num_seqs
        # slots would not fit (a waiting request then waits for a slot)
        stateful = bool(self.state_layers or self.draft_state_layers)
        self.num_state_slots = self._num_state_slots() if stateful else 0
        # and as many snapshots of it, for prefix caching (engine/state_snapshots.py)
        self.num_snapshots = self.num_state_slots if engine_config.enable_prefix_caching and self.state_layers else 0
        # one slot more than the manager hands out: padding rows of a CUDA graph batch use it
        # (allocated before the KV blocks are sized, so it counts against the memory budget too)
        self.scratch_state_slot = self.num_state_slots if self.state_layers else None
        for layer in self.state_layers:
            spec = layer.cache_spec()
            layer.bind_cache(spec.allocate(self.num_state_slots + 1, dtype, device),
                             spec.allocate(self.num_snapshots, dtype, device))
        # a hybrid draft model: each sequence's slot, and a second one its speculative tokens run
        # on (a copy of the first, made at its first draft: rows_batch), so the drafts it feeds
        # itself never advance the state its next catch-up continues from; no snapshots (the
        # draft model starts each sequence from its first token)
        for layer in self.draft_state_layers:
            spec = layer.cache_spec()
            layer.bind_cache(spec.allocate(2 * self.num_state_slots + 1, dtype, device),
                             spec.allocate(0, dtype, device))
        # the last verify step's rows, for rollback_states: seq_id -> (index among the step's
        # verify rows, the row's tokens)
        self._verify_rows: dict[int, tuple[int, int]] = {}
        self.num_blocks = self._num_kv_blocks()
        self._allocate_kv_cache()
        self.sampler = Sampler()
        self.graphs: dict[int, tuple[Replayable, torch.Tensor]] = {}  # batch size -> (graph, logits)
        # batch size -> [(longest context, graph, logits)], ascending: graphs for short contexts
        self.short_graphs: dict[int, list[tuple[int, Replayable, torch.Tensor]]] = {}
        # speculative steps' graphs, captured with the decode graphs: (draft model?, q) -> RowGraphs
        self.row_graphs: dict[tuple[bool, int], RowGraphs] = {}
        self._capture: Capture | None = None  # how graphs are recorded; None: every step eager
        # the reference ops read lengths on the host, which a graph capture cannot hold (hybrids
        # too: their decode steps run the linear-attention layers' Triton kernels, no host sync)
        if device.type == "cuda" and not enforce_eager and use_triton(torch.empty(0, device=device)):
            self._capture_decode_graphs()

    # ---- caches ---------------------------------------------------------------------------
    def _cache_bytes_per_block(self) -> int:
        """Every attention layer's K/V bytes for block_size tokens, from the layers' declarations."""
        return sum(layer.cache_spec().bytes_per_token(self.kv_cache_dtype)
                   for layer in self.kv_layers) * self.block_size

    def _num_state_slots(self) -> int:
        ec = self.engine_config
        if self.device.type != "cuda":
            return ec.max_num_seqs
        per_slot = sum(layer.cache_spec().bytes_per_slot(self.dtype) for layer in self.state_layers)
        per_slot += 2 * sum(layer.cache_spec().bytes_per_slot(self.dtype) for layer in self.draft_state_layers)
        free, total = torch.cuda.mem_get_info(self.device)
        budget = total * ec.gpu_memory_utilization - (total - free) - self._activation_bytes()
        slots = state_slots_that_fit(ec.max_num_seqs, per_slot, ec.enable_prefix_caching, budget)
        if slots < ec.max_num_seqs:
            logger.info("state slots for %d sequences at once, not max_num_seqs=%d: each sequence's "
                        "linear-attention state takes %.0f MB (twice that with its prefix-cache "
                        "snapshot), and the states may take half the memory left for caches",
                        slots, ec.max_num_seqs, per_slot / 2**20)
        return slots

    def _num_kv_blocks(self) -> int:
        ec = self.engine_config
        if ec.num_gpu_blocks_override is not None:
            return ec.num_gpu_blocks_override
        per_block = self._cache_bytes_per_block()
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = total * ec.gpu_memory_utilization - used - self._activation_bytes()
        else:
            # the CPU has no fixed pool; take what the longest batch could use, capped
            wanted = ec.max_num_seqs * ec.max_model_len * per_block // self.block_size
            budget = min(ec.cpu_kv_cache_gib * 2**30, wanted)
        num_blocks = int(budget // per_block)
        if num_blocks < 1:
            raise ValueError(
                "no memory left for the KV cache after loading the model; "
                "raise gpu_memory_utilization or lower max_num_batched_tokens"
            )
        return num_blocks

    def _activation_bytes(self) -> int:
        """Peak memory of one step beyond weights and cache: a few [tokens, hidden] activations
        and a layer's widest intermediates for the largest token batch, plus fp32 logits and
        sampler work space."""
        cfg, ec = self.model_config, self.engine_config
        per_token = (4 * cfg.hidden_size + cfg.activation_width()) * self.dtype.itemsize
        logits = ec.max_num_seqs * cfg.vocab_size * 4 * 4
        spec = 0
        if self.num_speculative_tokens:
            rows = min(ec.max_num_seqs, SPEC_GRAPH_MAX_ROWS)
            tokens = rows * (1 + self.num_speculative_tokens)
            # the verify graphs' logits buffer and one graph's logits in the pool
            spec = 2 * tokens * cfg.vocab_size * 4
            for layer in self.state_layers:  # a hybrid's verify rows: states before the step, inputs
                s = layer.cache_spec()
                spec += rows * s.bytes_per_slot(self.dtype) + tokens * (2 * s.conv_dim * self.dtype.itemsize
                                                                        + 2 * s.num_v_heads * 4)
        return ec.max_num_batched_tokens * per_token + logits + spec + 512 * 2**20

    def _allocate_kv_cache(self) -> None:
        # one block more than the manager hands out: padding rows of a CUDA graph batch write there
        self.scratch_block = self.num_blocks
        for layer in self.kv_layers:
            layer.bind_cache(layer.cache_spec().allocate(self.num_blocks + 1, self.block_size,
                                                         self.kv_cache_dtype, self.device))

    # ---- one step -------------------------------------------------------------------------
    def _prepare(
        self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, ForwardBatch, list[SeqState], list[tuple[SeqState, int, int, int]] | None]:
        """The step's flat batch tensors, and the sequences that sample, in row order. A decode
        row whose input token is still pending takes it from `prev`'s sampled ids on the device.
        A sequence with drafts (speculative decoding) feeds them after its last token and gets
        logits at each of them too (a verify step)."""
        rows: list[Row] = []
        pending: list[tuple[SeqState, int]] = []  # (sequence, row) of pending input tokens
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            drafts = seq.draft_token_ids
            end = start + num_new - len(drafts)  # past the sequence's own tokens
            if end > seq.num_known_tokens:  # only a decode's one token can be pending
                assert num_new == 1 and prev is not None, "a pending input token without its step"
                pending.append((seq, len(rows)))
                tokens = [0]
            else:
                tokens = seq.all_token_ids[start:end] + drafts
            rows.append(Row(seq, start, tokens, 1 + len(drafts) if end == seq.num_tokens else 0))
        ids, positions, batch, order = self.rows_batch(rows, state=True)
        if pending:
            at = {r: batch.cu_query_lens_host[i] for i, r in enumerate(order)}  # row -> first token
            index = torch.tensor([at[r] for _, r in pending], dtype=torch.int64)
            rows_prev = torch.tensor(prev.rows_of([seq for seq, _ in pending]), dtype=torch.int64)
            ids[index.to(self.device, non_blocking=True)] = prev.token_ids[rows_prev.to(self.device, non_blocking=True)]
        placed = None if self.mtp is None else [  # each row's tokens in the batch, for the MTP head
            (rows[r].seq, rows[r].first, len(rows[r].tokens), batch.cu_query_lens_host[i]) for i, r in enumerate(order)]
        return ids, positions, batch, [rows[r].seq for r in order if rows[r].num_logits], placed

    def rows_batch(self, rows: list[Row], state: bool = False) -> tuple[torch.Tensor, torch.Tensor, ForwardBatch, list[int]]:
        """A forward's flat batch from rows of tokens at positions over each sequence's block
        table: (input ids, positions, batch, the rows' order in it). Few-query rows go first, so
        a mixed step's attention splits there (ForwardBatch.split); `batch.logits_indices` lists
        each row's last `num_logits` tokens, in that order. `state`: the rows are the model's own
        step, whose hybrid state slots and snapshots the batch carries."""
        order = sorted(range(len(rows)), key=lambda r: len(rows[r].tokens) > DECODE_MAX_QUERY_LEN)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_query_lens = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        bs = self.block_size
        for r in order:
            seq, start, tokens, num_logits = rows[r]
            end = start + len(tokens)
            input_ids.extend(tokens)
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            cu_query_lens.append(cu_query_lens[-1] + len(tokens))
            context_lens.append(end)
            logits_indices.extend(range(cu_query_lens[-1] - num_logits, cu_query_lens[-1]))
        seqs = [rows[r].seq for r in order]
        max_blocks = max(len(seq.block_table) for seq in seqs)
        block_tables = [seq.block_table + [0] * (max_blocks - len(seq.block_table)) for seq in seqs]

        def t(data: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(data, dtype=dtype, device="cpu").to(self.device, non_blocking=True)

        scheduled = [(rows[r].seq, len(rows[r].tokens)) for r in order]
        stateful = state and bool(self.state_layers)
        verify_rows = verify_tokens = None
        if stateful:  # verify rows (drafts after the last token): rolled back after acceptance
            verify_rows = [i for i, seq in enumerate(seqs) if seq.draft_token_ids]
            self._verify_rows = {seqs[i].seq_id: (j, len(rows[order[i]].tokens))
                                 for j, i in enumerate(verify_rows)}
            if verify_rows:
                verify_tokens = t([p for i in verify_rows for p in range(cu_query_lens[i], cu_query_lens[i + 1])],
                                  torch.int64)
        state_slots = None
        if stateful:
            state_slots = t([seq.state_slot for seq in seqs], torch.int64)
        elif not state and self.draft_state_layers:
            state_slots = t(self._draft_state_slots([rows[r] for r in order]), torch.int64)
        batch = ForwardBatch(
            cu_query_lens=t(cu_query_lens, torch.int32),
            context_lens=t(context_lens, torch.int32),
            block_tables=t(block_tables, torch.int32),
            slot_mapping=t(slots, torch.int64),
            logits_indices=t(logits_indices, torch.int64),
            max_query_len=max(n for _, n in scheduled),
            max_context_len=max(context_lens),
            state_slots=state_slots,
            state_saves=self._state_saves(scheduled) if stateful else None,
            cu_query_lens_host=cu_query_lens,
            verify_rows=verify_rows or None,
            verify_tokens=verify_tokens,
        )
        num_few = sum(1 for _, n in scheduled if n <= DECODE_MAX_QUERY_LEN)
        if 0 < num_few < len(scheduled):
            batch.split = self._split_batch(batch, num_few, cu_query_lens, context_lens, scheduled)
        return t(input_ids, torch.int64), t(positions, torch.int64), batch, order

    def _draft_state_slots(self, rows: list[Row]) -> list[int]:
        """A hybrid draft model's forward (rows_batch without `state`): each row's slot in the
        draft's state pools. Rows of the sequence's own tokens (catching up) run on its slot; rows
        of drafts (at or past num_tokens) on its second slot, copied from the first at the first
        draft, so the next catch-up continues from the state after the sequence's tokens only."""
        n = self.num_state_slots
        slots, forks = [], []
        for seq, first, _, _ in rows:
            if first < seq.num_tokens:
                slots.append(seq.state_slot)
                continue
            slots.append(n + 1 + seq.state_slot)
            if first == seq.num_tokens:
                forks.append(seq.state_slot)
        if forks:
            src = torch.tensor(forks, dtype=torch.int64).to(self.device, non_blocking=True)
            for layer in self.draft_state_layers:
                layer.copy_states(src, src + (n + 1))
        return slots

    @torch.inference_mode()
    def rollback_states(self, rows: list[tuple[SeqState, int]]) -> None:
        """After a verify step's acceptance (hybrid models): each (sequence, tokens it kept of
        its row: accepted drafts + 1) of the step's verify rows. Its linear-attention layers'
        state slot is set back to the state after those tokens (GatedDeltaNet.rollback); a row
        that kept every token is left as it is. Queued on the device, no host sync. Called after
        the step's collect and before the next launch, which frees the step's records anyway (the
        rows that finished are not rolled back: their slots are free)."""
        picks = []
        for seq, kept in rows:
            j, num_tokens = self._verify_rows[seq.seq_id]
            assert 1 <= kept <= num_tokens, (kept, num_tokens)
            if kept < num_tokens:
                picks.append((j, kept))
        if picks:
            verify, kept = map(list, zip(*picks))
            for layer in self.state_layers:
                layer.rollback(verify, kept)
        self._free_verify_records()

    def _free_verify_records(self) -> None:
        for layer in self.state_layers:
            layer.verify = None
        self._verify_rows = {}

    def _state_saves(self, scheduled: list[tuple[SeqState, int]]) -> list[tuple[int, int, int]] | None:
        """Hybrid models: first the snapshots the step's sequences start from (a prefix hit) are
        copied into their slots; returns where the step saves snapshots, (row, tokens into the
        row's chunk, snapshot id), for the layers to save as they go. A decode step's saves are
        the runner's, after the forward (_save_decoded_snapshots), graph or not.

        A verify row saves where planned too, `cut` tokens into its last token and drafts. Kept
        tokens reach the cut: the state is the sequence's. They stop short of it: the pending
        snapshot holds a state with rejected drafts, labelled with a boundary past the sequence's
        computed tokens; it is never registered (registration needs the boundary block's hash, and
        blocks are hashed only up to computed tokens whose ids are known), and the step that
        brings the sequence to that boundary saves it again. (Not saving in verify rows would be
        wrong: plan_save has already moved the pending snapshot's boundary on, so an accepted run
        over it would leave the old state registered under the new boundary.)"""
        if not self.state_layers:
            return None
        self._restore_snapshots(scheduled)
        if all(n == 1 for _, n in scheduled):
            return None
        saves = [(row, *seq.save_at) for row, (seq, _) in enumerate(scheduled) if seq.save_at is not None]
        for seq, _ in scheduled:
            seq.save_at = None
        return saves

    def _restore_snapshots(self, scheduled: list[tuple[SeqState, int]]) -> None:
        """Copies the snapshots the step's sequences start from (a prefix hit) into their slots."""
        restores = [(seq.state_slot, seq.restore_snapshot) for seq, _ in scheduled
                    if seq.restore_snapshot is not None]
        if restores:
            slots, snaps = (torch.tensor(x, device=self.device) for x in zip(*restores))
            for layer in self.state_layers:
                layer.restore(snaps, slots)
            for seq, _ in scheduled:
                seq.restore_snapshot = None

    def _save_decoded_snapshots(self, scheduled: list[tuple[SeqState, int]]) -> None:
        """A decode step's snapshot saves, queued behind its forward (a graph's replay or an
        eager one): each sequence's state after its one token (the only place a decode step
        saves)."""
        saves = [(seq.state_slot, *seq.save_at) for seq, _ in scheduled if seq.save_at is not None]
        if not saves:
            return
        slots, cuts, snaps = zip(*saves)
        assert set(cuts) == {1}, "a decode step saves after its token"
        slots, snaps = torch.tensor(slots, device=self.device), torch.tensor(snaps, device=self.device)
        for layer in self.state_layers:
            layer.save(slots, snaps)
        for seq, _ in scheduled:
            seq.save_at = None

    def _split_batch(
        self, batch: ForwardBatch, num_few: int, cu_query_lens: list[int], context_lens: list[int],
        scheduled: list[tuple[SeqState, int]],
    ) -> tuple[int, ForwardBatch, ForwardBatch]:
        """A mixed step's (decode tokens, decode part, prefill part): views of the step's tensors,
        but for the prefill part's query offsets, which start again from 0."""
        num_few_tokens = cu_query_lens[num_few]
        no_logits = batch.logits_indices[:0]
        few = ForwardBatch(
            cu_query_lens=batch.cu_query_lens[: num_few + 1],
            context_lens=batch.context_lens[:num_few],
            block_tables=batch.block_tables[:num_few],
            slot_mapping=batch.slot_mapping[:num_few_tokens],
            logits_indices=no_logits,
            max_query_len=max(n for _, n in scheduled[:num_few]),
            max_context_len=max(context_lens[:num_few]),
        )
        rest = ForwardBatch(
            cu_query_lens=torch.tensor([c - num_few_tokens for c in cu_query_lens[num_few:]],
                                       dtype=torch.int32).to(self.device, non_blocking=True),
            context_lens=batch.context_lens[num_few:],
            block_tables=batch.block_tables[num_few:],
            slot_mapping=batch.slot_mapping[num_few_tokens:],
            logits_indices=no_logits,
            max_query_len=max(n for _, n in scheduled[num_few:]),
            max_context_len=max(context_lens[num_few:]),
        )
        return num_few_tokens, few, rest

    @torch.inference_mode()
    def launch(self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None = None) -> LaunchedStep:
        """Queues one step on the device: the forward, the sampling, and the copy of the sampled
        tokens to the host; returns without waiting for any of it (`collect` waits).

        `prev` is the step launched just before and not collected yet (async scheduling): a row
        whose input token is a pending token of prev's takes it from prev's sampled ids on the
        device. Such rows must be plain greedy (is_plain_greedy): the Sampler would read output
        token lists that lack the pending tokens."""
        if self._verify_rows:  # the last verify step's records, rolled back by now (or finished)
            self._free_verify_records()
        if any(seq.draft_token_ids for seq, _ in scheduled) and (verify := self._verify_in_graph(scheduled)):
            return verify
        self._hidden = (None, None)
        step = self._launch(scheduled, prev)
        # with an MTP head: its inputs, once the step's tokens are on the host (else None)
        (step.hidden, step.hidden_rows), self._hidden = self._hidden, (None, None)
        return step

    def _launch(self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None) -> LaunchedStep:
        graph_size = self._graph_size(scheduled)
        if graph_size:
            sampling = [seq for seq, _ in scheduled]
            inputs = self.decode_inputs
            plain = all(is_plain_greedy(seq) for seq in sampling)  # the graph samples them
            slot = inputs.take_slot() if plain and inputs.mapped else None
            if self.state_layers:  # a hybrid's state snapshots: restored before the replay, saved after
                self._restore_snapshots(scheduled)
            logits = self._run_decode_graph(scheduled, graph_size, prev, slot)
            if self.state_layers:
                self._save_decoded_snapshots(scheduled)
            if plain:
                n = len(sampling)
                return self._launched(scheduled, sampling, inputs.token_ids[:n], inputs.logprobs[:n],
                                      out_slot=slot)
        else:
            input_ids, positions, batch, sampling, placed = self._prepare(scheduled, prev)
            hidden = self.model(input_ids, positions, batch)
            if self.mtp is not None:  # (kept only for it: a prefill's activations otherwise)
                self._hidden = (hidden, placed)
            if self.state_layers and batch.max_query_len == 1:
                self._save_decoded_snapshots(scheduled)
            if not sampling:
                return LaunchedStep(scheduled, [], None, [], None)
            logits = self.model.compute_logits(hidden[batch.logits_indices])  # [num_logits, vocab]
            if any(seq.draft_token_ids for seq in sampling):
                return self._verify(scheduled, sampling, logits)
        out = self.sampler(
            logits,
            [s.params for s in sampling],
            [s.prompt_token_ids for s in sampling],
            [s.output_token_ids for s in sampling],
            [s.generator for s in sampling],
            # stop and EOS ids are held back until min_tokens; most requests set none, and a plain
            # greedy row has none in force (its output list may lack pending tokens)
            [list(s.stop_token_ids) if s.params.min_tokens and not is_plain_greedy(s) else []
             for s in sampling],
        )
        return self._launched(
            scheduled, sampling, out.token_ids, out.logprobs, out.top_logprob_ids, out.top_logprobs
        )

    def _verify(self, scheduled: list[tuple[SeqState, int]], sampling: list[SeqState],
                logits: torch.Tensor) -> LaunchedStep:
        """A verify step's tokens: each sequence's accepted drafts and one token more
        (hotpath/speculative/rejection.py), on the host when this returns."""
        from hotpath.speculative.rejection import verify_drafts

        verified = verify_drafts(
            logits,
            [s.draft_token_ids for s in sampling],
            [s.draft_probs for s in sampling],
            [s.params for s in sampling],
            [s.prompt_token_ids for s in sampling],
            [s.output_token_ids for s in sampling],
            [s.generator for s in sampling],
            [list(s.stop_token_ids) if s.params.min_tokens else [] for s in sampling],
        )
        tokens = {}
        for i, seq in enumerate(sampling):
            n = seq.params.logprobs or 0
            tops = verified.top_logprobs[i] if verified.top_logprobs is not None and n else None
            tokens[seq.seq_id] = [SampledToken(t, lp, tops[j][:n] if tops else [])
                                  for j, (t, lp) in enumerate(zip(verified.token_ids[i], verified.logprobs[i]))]
        return LaunchedStep(scheduled, sampling, None, [], None, verified=tokens)

    def _verify_in_graph(self, scheduled: list[tuple[SeqState, int]]) -> LaunchedStep | None:
        """A verify step as a graph of rows of q = 1 + K tokens, when every row is a decode or
        verify row (its last token, on the host, and its drafts) whose blocks hold q tokens (rows
        with fewer drafts pad); None to run it eagerly. Plain greedy rows take the
        graph's argmax as the target's tokens (accepted while they equal the drafts), the rest go
        through the rejection sampler on the graph's logits."""
        graphs = self.spec_graphs(draft=False, query_len=1 + self.num_speculative_tokens)
        if graphs is None or len(scheduled) > graphs.max_rows:
            return None
        q, bs, max_len = graphs.query_len, self.block_size, self.engine_config.max_model_len
        if any(  # padding stays inside the blocks the scheduler gave the row
            n != 1 + len(seq.draft_token_ids) or seq.num_computed_tokens + 1 != seq.num_known_tokens
            or seq.num_pending_tokens or seq.num_computed_tokens + q > min(len(seq.block_table) * bs, max_len)
            for seq, n in scheduled
        ):
            return None
        seqs = [seq for seq, _ in scheduled]
        rows = [(seq.num_computed_tokens, [seq.token_at(seq.num_computed_tokens)] + seq.draft_token_ids)
                for seq in seqs]
        logits, ids, logprobs = graphs.run(seqs, rows)  # [n * q, vocab], [n * q], [n * q]
        if not all(is_plain_greedy(seq) for seq in seqs):
            index = [i * q + j for i, (_, tokens) in enumerate(rows) for j in range(len(tokens))]
            return self._verify(scheduled, seqs, logits[torch.tensor(index).to(self.device, non_blocking=True)])
        ids, logprobs = ids.tolist(), logprobs.tolist()  # the step's one host synchronisation
        tokens = {}
        for i, seq in enumerate(seqs):
            drafts = seq.draft_token_ids
            target = ids[i * q : i * q + 1 + len(drafts)]  # the target's token after each input
            kept = next((j for j, d in enumerate(drafts) if d != target[j]), len(drafts)) + 1
            tokens[seq.seq_id] = [SampledToken(t, lp, []) for t, lp in zip(target[:kept], logprobs[i * q :])]
        return LaunchedStep(scheduled, seqs, None, [], None, verified=tokens)

    def spec_graphs(self, draft: bool, query_len: int) -> RowGraphs | None:
        """The graphs of the target's (or the draft model's) forwards over rows of `query_len`
        tokens, or None where those steps run eagerly (_capture_spec_graphs)."""
        return self.row_graphs.get((draft, query_len))

    def _launched(
        self,
        scheduled: list[tuple[SeqState, int]],
        sampling: list[SeqState],
        token_ids: torch.Tensor,  # [num_sampled] int64
        logprobs: torch.Tensor,  # [num_sampled] float32
        top_ids: torch.Tensor | None = None,  # [num_sampled, k] int64
        top_logprobs: torch.Tensor | None = None,  # [num_sampled, k] float32
        out_slot: int | None = None,
    ) -> LaunchedStep:
        """Starts copying the sampled tensors to the host behind the step's work on the stream;
        for a graph step that writes them into the decode inputs' host ring row `out_slot`
        itself, only marks the step's end."""
        outputs = [token_ids, logprobs, top_ids, top_logprobs]
        on_cuda = self.device.type == "cuda"
        if out_slot is not None:
            n = len(sampling)
            inputs = self.decode_inputs
            host = [inputs.host_token_ids[out_slot, :n], inputs.host_logprobs[out_slot, :n], None, None]
        elif not on_cuda:  # copies, since the graph outputs are rewritten next step
            host = [t.clone() if t is not None else None for t in outputs]
        else:
            # fresh pinned tensors: the caching host allocator reuses one only after its copy is done
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                    if t is not None else None for t in outputs]
        done = torch.cuda.Event() if on_cuda else None
        if done is not None:
            done.record()
        return LaunchedStep(scheduled, sampling, token_ids, host, done, out_slot)

    def collect(self, step: LaunchedStep) -> dict[int, list[SampledToken]]:
        """Waits for a launched step's tokens; returns each sampling sequence's tokens (one, or
        a verify step's accepted drafts and the token after them), by seq_id."""
        if step.verified is not None:
            return step.verified
        if step.done is not None:
            step.done.synchronize()  # the step's one host synchronisation
        if not step.sampling:
            return {}
        token_ids, logprobs, top_ids, top_logprobs = step.host
        ids, lps = token_ids.tolist(), logprobs.tolist()
        if step.out_slot is not None:
            self.decode_inputs.release_slot(step.out_slot)
        top_ids = top_ids.tolist() if top_ids is not None else None
        top_vals = top_logprobs.tolist() if top_logprobs is not None else None
        result = {}
        for i, seq in enumerate(step.sampling):
            n = seq.params.logprobs or 0
            top = list(zip(top_ids[i][:n], top_vals[i][:n])) if top_ids is not None and n else []
            result[seq.seq_id] = [SampledToken(ids[i], lps[i], top)]
        return result

    # ---- CUDA graphs for decode ---------------------------------------------------------
    def _graph_size(self, scheduled: list[tuple[SeqState, int]]) -> int:
        """The captured batch size to run this step with, or 0 to run it eagerly. (A hybrid's
        snapshot saves and restores do not make a step eager: launch copies them around the replay.)"""
        return decode_graph_size(scheduled, list(self.graphs))  # ascending

    def _capture_decode_graphs(self, capture: Capture | None = None) -> None:
        """Captures model forward + LM head + greedy sampling for decode batches of each bucket size.

        Graphs replay on static buffers (runner/decode_inputs.py): every step copies its token ids,
        positions, slots, context lengths, block tables (and a hybrid's state slots) into them, in
        one copy. Rows past the real batch attend to one token in the scratch block and run the
        linear-attention layers on the scratch state slot, so padding never touches a sequence's
        cache. Small batches also get graphs for short contexts (SHORT_CONTEXT_GRAPHS). `capture`
        records one forward (a CUDA graph by default; tests pass an eager stand-in to run this
        path on the CPU)."""
        ec = self.engine_config
        max_bs = min(ec.max_num_seqs, 256)
        sizes = sorted({b for b in GRAPH_BATCH_SIZES if b <= max_bs} | {max_bs})
        max_blocks = -(-ec.max_model_len // self.block_size)
        self.decode_inputs = DecodeInputs(max_bs, max_blocks, self.scratch_block, self.block_size, self.device,
                                          self.scratch_state_slot)
        # with an MTP head, the graphs also leave the final hidden states here: [max_bs, hidden]
        self.decode_hidden = None if self.mtp is None else torch.empty(
            (max_bs, self.model_config.hidden_size), dtype=self.dtype, device=self.device)
        stand_in = capture is not None
        if capture is None:
            pool = torch.cuda.graph_pool_handle()  # shared: graphs never replay at the same time

            def capture(forward: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
                return _capture_cuda_graph(forward, pool)
        self._capture = capture
        max_len, kv_heads = ec.max_model_len, self.model_config.num_key_value_heads
        for bs in reversed(sizes):  # largest first, so smaller graphs reuse its memory pool
            carveout = contextlib.nullcontext() if stand_in else self._decode_carveout(bs)
            with torch.inference_mode(), carveout:
                # the warm-up runs the kernels on these inputs: padding rows (one key each in the
                # scratch block, the scratch state slot), never the buffer's zeros (a context of
                # 0 keys puts a query at position -1, and its cos/sin load one row before the table)
                self.decode_inputs.fill([], bs)
                host_out = self.decode_inputs.host_out(bs) if self.decode_inputs.mapped else None
                hidden = None if self.decode_hidden is None else self.decode_hidden[:bs]
                self.graphs[bs] = capture(graph_forward(self.model, self.decode_inputs, bs, max_len, host_out,
                                                        hidden_out=hidden))
                self.short_graphs[bs] = [
                    (ctx, *capture(graph_forward(self.model, self.decode_inputs, bs, ctx, host_out, hidden_out=hidden)))
                    for ctx in context_buckets(bs, kv_heads, max_len, SHORT_CONTEXT_GRAPHS, self.device)[:-1]]
        self.graphs = dict(sorted(self.graphs.items()))  # ascending, for _graph_size
        self._capture_spec_graphs()

    def _capture_spec_graphs(self) -> None:
        """Speculative decoding's graphs (runner/row_graphs.py): the target's verify rows of
        1 + K tokens, the draft model's catch-up over as many and its one-token steps; none for a
        model with linear-attention layers (its verify rows record their states for the
        rollback; a hybrid draft drafts on a copy of its slot), which runs those steps eagerly."""
        q = 1 + self.num_speculative_tokens
        if q == 1 or q > DECODE_MAX_QUERY_LEN:  # longer rows take the prefill kernel: eager
            return
        ec = self.engine_config
        sets = []
        if not self.state_layers and self.mtp is None:  # (a verify graph keeps no hidden states)
            sets.append((False, q))
        if self.draft_model is not None and not self.draft_state_layers:
            sets += [(True, q), (True, 1)]
        for draft, query_len in sets:
            graphs = RowGraphs(
                self.draft_model if draft else self.model, query_len, min(ec.max_num_seqs, SPEC_GRAPH_MAX_ROWS),
                -(-ec.max_model_len // self.block_size), self.scratch_block, self.block_size, self.device,
                ec.max_model_len, SHORT_CONTEXT_GRAPHS, self._capture, logits=not draft)
            graphs.capture_all()
            self.row_graphs[(draft, query_len)] = graphs

    def _decode_carveout(self, bs: int) -> contextlib.AbstractContextManager:
        """The L1 / shared memory split a decode graph of `bs` rows is captured with: the same
        for every kernel where one row's step is all Triton kernels (the few-rows forward), the
        driver's choice otherwise."""
        from hotpath.ops.triton_utils import shared_memory_carveout

        if bs != 1 or not self.model.model.few_rows(1):
            return contextlib.nullcontext()
        # 10% of L1 as shared memory beat the driver's choice by 1-3.5% on Qwen3 0.6B-32B (H200);
        # the int4 GEMV stages its tiles through shared memory, and at 10% an SM held one of its
        # programs (Qwen2.5-Coder-32B AWQ: 48.3 ms a step against 31.7 ms of kernels, run T)
        return shared_memory_carveout(10, {"_int4_gemv_kernel": -1})

    def _run_decode_graph(
        self, scheduled: list[tuple[SeqState, int]], size: int, prev: LaunchedStep | None, slot: int | None
    ) -> torch.Tensor:
        seqs = [seq for seq, _ in scheduled]
        # every pending input token is one prev sampled (they come only from pipelined decodes)
        sources = None if prev is None else (prev.token_ids, prev.rows_of(seqs))
        self.decode_inputs.fill(seqs, size, sources, slot)
        graph, logits = self.graphs[size]
        if short := self.short_graphs.get(size):  # only small batches have them
            longest = max(seq.num_computed_tokens + 1 for seq in seqs)  # padding rows attend to 1
            graph, logits = next(((g, out) for ctx, g, out in short if longest <= ctx), (graph, logits))
        graph.replay()
        if self.mtp is not None:  # a copy: the next replay writes the buffer again
            self._hidden = (self.decode_hidden[: len(seqs)].clone(),
                            [(seq, seq.num_computed_tokens, 1, i) for i, seq in enumerate(seqs)])
        return logits[: len(seqs)]
