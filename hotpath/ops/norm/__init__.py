"""RMSNorm, plain and fused with the residual add, and LayerNorm fused with it: the reference on the CPU, Triton on the GPU
(see hotpath/ops/backend.py)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.norm import reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if backend.use_triton(x):
        from hotpath.ops.norm import triton as kernels

        return kernels.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if backend.use_triton(x):
        from hotpath.ops.norm import triton as kernels

        return kernels.fused_add_rms_norm(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, gate [num_tokens, heads, head_dim] (strided views are fine) -> rms_norm(x) * weight *
    silu(gate) per head, [num_tokens, heads * head_dim]: one launch on the GPU."""
    if backend.use_triton(x):
        from hotpath.ops.norm import triton as kernels

        return kernels.gated_rms_norm(x, gate, weight, eps)
    return reference.gated_rms_norm(x, gate, weight, eps)


def fused_add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual): the vision towers' residual add and the next
    sublayer's norm in one pass."""
    if backend.use_triton(x):
        from hotpath.ops.norm import triton as kernels

        return kernels.fused_add_layer_norm(x, residual, weight, bias, eps)
    return reference.fused_add_layer_norm(x, residual, weight, bias, eps)


__all__ = ["fused_add_layer_norm", "fused_add_rms_norm", "gated_rms_norm", "rms_norm"]
