"""Token embedding and the LM head (which may share the embedding's weight), vocab-parallel.

Under tensor parallelism each rank holds vocab / tp rows of the [vocab, hidden] matrix (the
vocabulary padded up to a multiple of tp; the padding rows are zero and never sampled): the
embedding looks up the tokens in its rows (others zero) and all-reduces, the LM head computes its
rows' logits for the rows that sample and all-gathers them into the full fp32 logits on every
rank, the padding cut off. Both take the same layout, so a tied LM head shares the embedding's
parameter as on one rank. On one rank both are the plain lookup and projection.

A format that stores either matrix quantized (a GGUF) gives it its LinearMethod (`set_method`,
one rank): the LM head runs the method's kernel, the embedding looks rows up through the method
(`embed`: the rows dequantized, in the model dtype).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from hotpath.distributed.parallel_state import current_parallel
from hotpath.layers.linear import WeightLoaders
from hotpath.layers.quant.base import LinearMethod
from hotpath.ops.embedding import embedding_with_sumsq
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
        self.hidden_size = hidden_size
        self.method: LinearMethod | None = None

    def set_method(self, method: LinearMethod) -> None:
        """The matrix in a quantized format that stores it so (a GGUF's): its parameters the
        method's, filled through it (one rank only)."""
        if self.tp.size > 1:
            raise ValueError(f"a quantized {type(self).__name__} ({type(method).__name__}) does not "
                             "split over tensor-parallel ranks")
        del self.weight
        # what a LinearMethod reads of its layer (hotpath.layers.linear.Linear's one-rank values)
        self.in_features, self.output_sizes = self.hidden_size, [self.vocab_size]
        self.output_ranges = self.input_range = self.bias = None
        self.dtype = torch.get_default_dtype()  # the model's, which it is built in
        self.method_probe = torch.empty(1, self.hidden_size)  # [1, H]: stand_in's dtype and device
        self.method = method
        method.create_weights(self, self.hidden_size, self.vocab_size)

    def share_method(self, other: VocabParallel) -> None:
        """Tied to `other`'s matrix in a quantized format: its method and its very parameters."""
        del self.weight
        for name, param in other.named_parameters(recurse=False):
            setattr(self, name, param)
        for attr in ("in_features", "output_sizes", "output_ranges", "input_range", "bias", "dtype",
                     "method_probe", "method"):
            setattr(self, attr, getattr(other, attr))

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        return {f"{prefix}.weight": self.weight_loader}

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        """Fills `param_name` from its value in the one-rank model (loader/dummy.py)."""
        assert param_name == "weight", param_name
        self.weight_loader(full)

    def weight_loader(self, loaded: torch.Tensor) -> None:
        """Takes this rank's rows of the full [vocab, hidden] checkpoint tensor."""
        if self.method is not None:
            self.method.load_checkpoint(self, self.weight, 0, loaded)
            return
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
        if self.method is not None:
            return self.method.embed(self, input_ids)
        return F.embedding(input_ids, self.weight)

    def with_sumsq(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows [T, hidden], their sums of squares [1, T] fp32): the first layer's input and
        its RMSNorm statistic (hotpath.ops.embedding.embedding_with_sumsq)."""
        if self.method is not None:
            h = self(input_ids)
            return h, h.float().pow(2).sum(-1)[None, :]
        return embedding_with_sumsq(input_ids, self.weight)

    def stand_in(self, num_tokens: int) -> torch.Tensor:
        """[num_tokens, hidden] with the rows' dtype and device, no memory of its own: what a
        step's input will be like, for the decode path's checks."""
        if self.method is not None:
            return self.method_probe.expand(num_tokens, -1)
        return self.weight[:1].expand(num_tokens, -1)

    def _forward_parallel(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start  # [T]
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(torch.where(mine, local, 0), self.weight)  # [T, hidden]
        out.masked_fill_(~mine[:, None], 0)
        return self.tp.all_reduce(out)


class LMHead(VocabParallel):
    """Computes fp32 logits for the rows that are sampled (not every prefill token): the caller
    passes only those rows, so under tp only they are gathered.

    A head that a quantized format stores quantized (a GGUF's output.weight, or a tied model's
    token_embd) runs through that format's LinearMethod (`set_method` / `share_method`, on one
    rank): its parameters and its kernel."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        if self.tp.size > 1:
            self.forward = self._forward_parallel

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
