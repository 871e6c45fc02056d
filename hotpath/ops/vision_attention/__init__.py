"""Attention of a vision tower: every token of a segment (an image, a video frame) sees every
token of its segment and no other, with no causal mask and no KV cache.

`varlen_attention` runs the readable reference on the CPU and the FlashAttention-style Triton
kernel on the GPU (see hotpath/ops/backend.py).
"""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.vision_attention import reference


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


__all__ = ["varlen_attention"]
