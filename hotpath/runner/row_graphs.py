"""CUDA graphs of a model's forward over rows of q tokens each, captured on first use.

Speculative decoding runs three kinds of fixed-shape steps besides plain decodes: the target's
verify steps (each row its last token and up to K drafts, q = 1 + K: rows with fewer drafts pad),
a draft model's catch-up over the last q tokens of each sequence, and the draft model's one-token
steps (q = 1). Each (model, q) gets a RowGraphs: static inputs (runner/decode_inputs.py, rows of q
tokens) and one graph per batch-size bucket and context bucket, all captured at start-up with the
decode graphs (a capture compiles kernels for its shapes: seconds, which a step must not pay). A
graph records the forward, the LM head and the greedy argmax of every position. A verify graph
also copies its logits into one buffer the graphs share, for the rows the rejection sampler
verifies; a draft graph keeps none (its drafts are the argmax).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hotpath.runner.seq_state import SeqState
from hotpath.ops.attention import decode_splits
from hotpath.ops.sampling import greedy_sample
from hotpath.runner.decode_inputs import DecodeInputs

# batch-size buckets of the graphs (a step runs in the smallest that holds it; rows past it pad)
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def graph_forward(model: torch.nn.Module, inputs: DecodeInputs, size: int, max_context_len: int,
                  host_out: tuple | None = None, logits_out: torch.Tensor | None = None,
                  keep_logits: bool = True, hidden_out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """The forward a graph of `size` rows records: model, LM head and greedy sampling of every
    token, all on views of the static inputs, for contexts up to `max_context_len`. Returns the
    logits [size * q, vocab] (copied into `logits_out` when given), or with keep_logits=False the
    greedy ids, which overwrite the input ids (the next step's inputs) in any case. `hidden_out`:
    where the final hidden states go too (an MTP head's input)."""
    # kernels size their grids from max_context_len: every replay's contexts stay within it
    input_ids, positions, batch = inputs.views(size, max_context_len)
    n = input_ids.shape[0]

    def forward() -> torch.Tensor:
        hidden = model(input_ids, positions, batch)
        if hidden_out is not None:
            hidden_out.copy_(hidden)
        logits = model.compute_logits(hidden)  # [size * q, vocab]
        greedy_sample(logits, out=(inputs.token_ids[:n], inputs.logprobs[:n]), host_out=host_out)
        if logits_out is not None:
            return logits_out[:n].copy_(logits)
        return logits if keep_logits else inputs.token_ids[:n]

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
                 short_contexts: tuple[int, ...],
                 capture: Callable[[Callable[[], torch.Tensor]], tuple], logits: bool) -> None:
        self.model = model
        self.query_len = query_len
        self.sizes = [b for b in GRAPH_BATCH_SIZES if b < max_rows] + [max_rows]
        self.inputs = DecodeInputs(max_rows, max_blocks, scratch_block, block_size, device, query_len=query_len)
        self.capture = capture
        # [max_rows * q, vocab] fp32, which every graph copies its logits into (logits=True)
        self.logits = torch.empty((max_rows * query_len, model.config.vocab_size), dtype=torch.float32,
                                  device=device) if logits else None
        self.graphs: dict[tuple[int, int], tuple] = {}  # (size, longest context) -> (graph, output)
        # size -> the longest contexts its graphs hold, ascending (worked out once: a step's host
        # time is the verify step's cost beyond the device's)
        kv_heads = model.config.num_key_value_heads
        self.buckets = {size: context_buckets(size, kv_heads, max_model_len, short_contexts, device)
                        for size in self.sizes}

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def capture_all(self) -> None:
        """Every (size, context) graph, largest first (smaller graphs reuse their pool's memory)."""
        for size in reversed(self.sizes):
            for ctx in self.buckets[size]:
                with torch.inference_mode():
                    self.inputs.fill([], size)  # the warm-up and capture run on padding rows
                    self.graphs[(size, ctx)] = self.capture(graph_forward(
                        self.model, self.inputs, size, ctx, logits_out=self.logits, keep_logits=False))

    def run(self, seqs: list[SeqState], rows: list[tuple[int, list[int]]],
            prev: tuple[torch.Tensor, list[int]] | None = None) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Replays the graph for these rows: seqs[i]'s tokens rows[i] = (first position, tokens),
        up to q of them (padded to q), or with `prev` one token read from prev's ids (see
        DecodeInputs.fill). Returns views of the graph's outputs for the real rows' q positions
        each: (logits [n * q, vocab] or None, greedy ids [n * q], their logprobs [n * q]), valid
        until the next replay."""
        q = self.query_len
        size = next(s for s in self.sizes if s >= len(seqs))
        longest = max(first for first, _ in rows) + q
        graph, _ = self.graphs[(size, next(c for c in self.buckets[size] if c >= longest))]
        self.inputs.fill(seqs, size, prev, None, rows)
        graph.replay()
        n = len(seqs) * q
        logits = None if self.logits is None else self.logits[:n]
        return logits, self.inputs.token_ids[:n], self.inputs.logprobs[:n]
