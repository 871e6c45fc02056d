"""Token embedding and the LM head (which may share the embedding's weight), vocab-parallel.

Under tensor parallelism each rank holds vocab / tp rows of the [vocab, hidden] matrix (the
vocabulary padded up to a multiple of tp; the padding rows are zero and never sampled): the
embedding looks up the tokens in its rows (others zero) and all-reduces, the LM head computes its
rows' logits for the rows that sample and all-gathers them into the full fp32 logits on every
rank, the padding cut off. Both take the same layout, so a tied LM head shares the embedding's
parameter as on one rank. On one rank both are the plain lookup and projection.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from hotpath.distributed.parallel_state import current_parallel
from hotpath.layers.linear import WeightLoaders
from hotpath.layers.quant.base import LinearMethod
from hotpath.ops.linear import linear


class VocabParallel(nn.Module):
    """A [vocab, hidden] matrix whose rows split over the tp ranks: this rank's are
    [vocab_start, vocab_start + weight.shape[0]), those past vocab_size padding."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        tp = current_parallel().tp
        self.tp = tp
        self.vocab_size = vocab_size
        rows = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * rows
        self.padded_vocab = rows * tp.size
        self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)  # [V/tp, H]

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        return {f"{prefix}.weight": self.weight_loader}

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        """Fills `param_name` from its value in the one-rank model (loader/dummy.py)."""
        assert param_name == "weight", param_name
        self.weight_loader(full)

    def weight_loader(self, loaded: torch.Tensor) -> None:
        """Takes this rank's rows of the full [vocab, hidden] checkpoint tensor."""
        expected = (self.vocab_size, self.weight.shape[1])
        if loaded.shape != expected:
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
        if self.tp.size == 1:
            self.weight.data.copy_(loaded)
            return
        mine = loaded[self.vocab_start:self.vocab_start + self.weight.shape[0]]
        self.weight.data[:mine.shape[0]].copy_(mine)
        self.weight.data[mine.shape[0]:].zero_()  # padding rows


class VocabEmbedding(VocabParallel):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        if self.tp.size > 1:
            self.forward = self._forward_parallel

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        return F.embedding(input_ids, self.weight)

    def _forward_parallel(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start  # [T]
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(torch.where(mine, local, 0), self.weight)  # [T, hidden]
        out.masked_fill_(~mine[:, None], 0)
        return self.tp.all_reduce(out)


class LMHead(VocabParallel):
    """Computes fp32 logits for the rows that are sampled (not every prefill token): the caller
    passes only those rows, so under tp only they are gathered.

    An untied head that a quantized format stores quantized (a GGUF's output.weight) runs through
    that format's LinearMethod (`set_method`, on one rank): its parameters and its kernel."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        self.method: LinearMethod | None = None
        if self.tp.size > 1:
            self.forward = self._forward_parallel

    def set_method(self, method: LinearMethod) -> None:
        if self.tp.size > 1:
            raise ValueError(f"a quantized LM head ({type(method).__name__}) does not split over "
                             "tensor-parallel ranks")
        hidden = self.weight.shape[1]
        del self.weight
        # what a LinearMethod reads of its layer (hotpath.layers.linear.Linear's one-rank values)
        self.in_features, self.output_sizes = hidden, [self.vocab_size]
        self.output_ranges = self.input_range = self.bias = None
        self.method = method
        method.create_weights(self, hidden, self.vocab_size)

    def weight_loader(self, loaded: torch.Tensor) -> None:
        if self.method is None:
            super().weight_loader(loaded)
        else:
            self.method.load_checkpoint(self, self.weight, 0, loaded)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [rows, hidden] -> [rows, vocab]
        if self.method is not None:
            return self.method.apply(self, hidden, None, torch.float32)
        return linear(hidden, self.weight, out_dtype=torch.float32)

    def _forward_parallel(self, hidden: torch.Tensor) -> torch.Tensor:
        mine = linear(hidden, self.weight, out_dtype=torch.float32)  # [rows, vocab / tp]
        logits = self.tp.all_gather(mine, dim=-1)  # [rows, padded vocab]
        if self.padded_vocab != self.vocab_size:
            logits = logits[..., :self.vocab_size].contiguous()
        return logits
