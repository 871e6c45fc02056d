"""Attention of a vision tower: every token of a segment (an image, a video frame) sees every
token of its segment and no other, with no causal mask and no KV cache.

`apply_rotary` (the towers' 2D rotary on q and k, before attention) and `varlen_attention` run
the readable reference on the CPU and the Triton kernels on the GPU (see hotpath/ops/backend.py).
"""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.vision_attention import reference


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, rows, head_dim]: q and k of every head (any token stride)
    cos: torch.Tensor,  # [num_tokens, head_dim] fp32
    sin: torch.Tensor,
) -> torch.Tensor:  # [num_tokens, rows, head_dim] in x's dtype, contiguous
    if backend.use_triton(x):
        from hotpath.ops.vision_attention import triton as kernels

        return kernels.apply_rotary(x, cos, sin)
    return reference.apply_rotary(x, cos, sin)


def varlen_attention(
    q: torch.Tensor,  # [total_tokens, num_heads, head_dim] (any token/head strides)
    k: torch.Tensor,  # [total_tokens, num_heads, head_dim]
    v: torch.Tensor,  # [total_tokens, num_heads, head_dim]
    cu_seqlens: torch.Tensor,  # [num_segments + 1] int32
    max_seqlen: int,
    scale: float,
) -> torch.Tensor:  # [total_tokens, num_heads, head_dim], contiguous
    if backend.use_triton(q):
        from hotpath.ops.vision_attention import triton as kernels

        return kernels.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale)
    return reference.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale)


__all__ = ["apply_rotary", "varlen_attention"]
