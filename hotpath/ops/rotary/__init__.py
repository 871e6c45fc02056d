"""Rotary position embedding fused with QK-norm and the KV-cache write: the reference on the CPU,
Triton on the GPU (see hotpath/ops/backend.py)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.rotary import reference


def qk_norm_rope_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """See reference.qk_norm_rope_and_cache."""
    args = (q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            q_norm_weight, k_norm_weight, eps, k_scale, v_scale)
    if backend.use_triton(q):
        from hotpath.ops.rotary import triton as kernels

        return kernels.qk_norm_rope_and_cache(*args)
    return reference.qk_norm_rope_and_cache(*args)


__all__ = ["qk_norm_rope_and_cache"]
