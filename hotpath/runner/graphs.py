"""CUDA graphs of decode steps (one per batch-size bucket, and per short-context bucket for small
batches) and of speculative decoding's rows, captured at start-up and replayed on static inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import torch

from hotpath.ops.attention import DECODE_MAX_QUERY_LEN
from hotpath.runner.decode_inputs import DecodeInputs
from hotpath.runner.plan import SPEC_GRAPH_MAX_ROWS, decode_graph_size
from hotpath.runner.row_graphs import GRAPH_BATCH_SIZES, RowGraphs, context_buckets, graph_forward
from hotpath.runner.seq_state import SeqState
from hotpath.runner.step_types import LaunchedStep


class Replayable(Protocol):
    def replay(self) -> None: ...


# Longest contexts of the extra decode graphs captured for short contexts: a graph's attention
# splits each context over programs sized for the longest it may meet (max_model_len), and at a
# fraction of that most find no keys and still cost (docs/decisions.md, runner). So a batch size
# also gets a graph for each of these below max_model_len that at least halves its splits; a step
# takes the smallest that holds its longest context.
SHORT_CONTEXT_GRAPHS = (1024, 2048)

# records a decode forward once: (something to replay it with, its logits output tensor)
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replayable, torch.Tensor]]


def _capture_cuda_graph(forward: Callable[[], torch.Tensor], pool: tuple) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    forward()  # warm up: Triton compiles and autotunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits = forward()
    torch.cuda.synchronize()
    return graph, logits


class DecodeGraphs:
    """ModelRunner's graphs: reads its model, configs, caches' scratch block and slot, and MTP head."""

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
        # a small shared-memory carveout beat the driver's choice for the GEMV-bound step; the int4
        # GEMV stages its tiles in shared memory and keeps the driver's (docs/decisions.md, runner)
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
