"""Gated activations: the reference on the CPU, Triton on the GPU (see hotpath/ops/backend.py)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.activation import reference


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if backend.use_triton(x):
        from hotpath.ops.activation import triton as kernels

        return kernels.silu_and_mul(x)
    return reference.silu_and_mul(x)


__all__ = ["silu_and_mul"]
