"""The token bitmask of structured output applied to logits: the reference on the CPU, Triton on
the GPU (see hotpath/ops/backend.py)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.bitmask import reference


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    if backend.use_triton(logits):
        from hotpath.ops.bitmask import triton as kernels

        kernels.apply_token_bitmask(logits, bitmask, rows)
    else:
        reference.apply_token_bitmask(logits, bitmask, rows)


__all__ = ["apply_token_bitmask"]
