"""CUDA graphs of a model's forward over rows of q tokens each, captured on first use.

Speculative decoding runs three kinds of fixed-shape steps besides plain decodes: the target's
verify steps (each row its last token and k drafts, q = 1 + k), a draft model's catch-up over the
last q tokens of each sequence, and the draft model's one-token steps (q = 1). Each (model, q)
gets a RowGraphs: static inputs (runner/decode_inputs.py, rows of q tokens) and one graph per
batch-size bucket and context bucket, captured the first time a step needs it (k is chosen step
by step, so most (q, size) pairs are never met). A graph records the forward, the LM head and the
greedy argmax of every position; its logits stay readable for the Sampler's and the rejection
sampler's rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hotpath.engine.sequence import Sequence
from hotpath.ops.attention import decode_splits
from hotpath.ops.sampling import greedy_sample
from hotpath.runner.decode_inputs import DecodeInputs

# batch-size buckets of the graphs (a step runs in the smallest that holds it; rows past it pad)
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def graph_forward(model: torch.nn.Module, inputs: DecodeInputs, size: int, max_context_len: int,
                  host_out: tuple | None = None) -> Callable[[], torch.Tensor]:
    """The forward a graph of `size` rows records: model, LM head and greedy sampling of every
    token, all on views of the static inputs, for contexts up to `max_context_len`; returns the
    logits [size * q, vocab]. The greedy ids overwrite the input ids (the next step's inputs)."""
    # kernels size their grids from max_context_len: every replay's contexts stay within it
    input_ids, positions, batch = inputs.views(size, max_context_len)
    n = input_ids.shape[0]

    def forward() -> torch.Tensor:
        hidden = model(input_ids, positions, batch)
        logits = model.compute_logits(hidden)  # [size * q, vocab]
        greedy_sample(logits, out=(inputs.token_ids[:n], inputs.logprobs[:n]), host_out=host_out)
        return logits

    return forward


def context_buckets(size: int, num_kv_heads: int, max_len: int, short: tuple[int, ...],
                    device: torch.device) -> list[int]:
    """The longest contexts graphs of `size` rows are captured for, ascending: max_len, and each
    shorter one of `short` that at least halves the attention's splits (each split of a graph
    sized for long contexts costs even where a short context leaves it no keys)."""
    splits = decode_splits(size, num_kv_heads, max_len, device)
    return [c for c in short if c < max_len and 2 * decode_splits(size, num_kv_heads, c, device) <= splits] + [max_len]


class RowGraphs:
    def __init__(self, model: torch.nn.Module, query_len: int, max_rows: int, max_blocks: int,
                 scratch_block: int, block_size: int, device: torch.device, max_model_len: int,
                 num_kv_heads: int, short_contexts: tuple[int, ...],
                 capture: Callable[[Callable[[], torch.Tensor]], tuple]) -> None:
        self.model = model
        self.query_len = query_len
        self.sizes = [b for b in GRAPH_BATCH_SIZES if b < max_rows] + [max_rows]
        self.inputs = DecodeInputs(max_rows, max_blocks, scratch_block, block_size, device, query_len=query_len)
        self.max_model_len, self.num_kv_heads = max_model_len, num_kv_heads
        self.short_contexts, self.device = short_contexts, device
        self.capture = capture
        self.graphs: dict[tuple[int, int], tuple] = {}  # (size, longest context) -> (graph, logits)
        self.num_captures = 0

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def run(self, seqs: list[Sequence], rows: list[tuple[int, list[int]]],
            prev: tuple[torch.Tensor, list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replays the graph for these rows: seqs[i]'s tokens rows[i] = (first position, tokens),
        up to q of them (padded to q), or with `prev` one token read from prev's ids (see
        DecodeInputs.fill). Returns views of the graph's outputs for the real rows' q positions
        each: (logits [n * q, vocab], greedy ids [n * q], their logprobs [n * q]), valid until
        the next replay."""
        q = self.query_len
        size = next(s for s in self.sizes if s >= len(seqs))
        longest = max(first for first, _ in rows) + q
        buckets = context_buckets(size, self.num_kv_heads, self.max_model_len, self.short_contexts, self.device)
        ctx = next(c for c in buckets if c >= longest)
        if (size, ctx) not in self.graphs:
            with torch.inference_mode():
                self.inputs.fill([], size)  # the warm-up and capture run on padding rows
                self.graphs[(size, ctx)] = self.capture(graph_forward(self.model, self.inputs, size, ctx))
            self.num_captures += 1
        self.inputs.fill(seqs, size, prev, None, rows)
        graph, logits = self.graphs[(size, ctx)]
        graph.replay()
        n = len(seqs) * q
        return logits[:n], self.inputs.token_ids[:n], self.inputs.logprobs[:n]
