"""Token embedding lookup that also leaves the first RMSNorm's statistic: the reference on the
CPU, Triton on the GPU (see hotpath/ops/backend.py)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.embedding import reference


def embedding_with_sumsq(
    input_ids: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight[input_ids] [M, hidden], its rows' sums of squares [1, M] fp32): the first layer's
    qkv GEMV normalises its input from that statistic (ops/linear's `rms=`), so no RMSNorm kernel
    runs before it."""
    if backend.use_triton(weight):
        from hotpath.ops.embedding import triton as kernels

        return kernels.embedding_with_sumsq(input_ids, weight)
    return reference.embedding_with_sumsq(input_ids, weight)


__all__ = ["embedding_with_sumsq"]
