"""Attention of a vision tower: every token of a segment (an image, a video frame) sees every
token of its segment and no other, with no causal mask and no KV cache.

`apply_rotary` (the towers' 2D rotary on q and k, before attention) and `varlen_attention` run
the readable reference on the CPU and the Triton kernels on the GPU (see hotpath/ops/backend.py);
given the segments' lengths on the host, `varlen_attention` runs torch's cuDNN attention instead
where it can (NVIDIA, 16-bit, the default backend: sdpa.py).
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
    segment_lengths: list[int] | None = None,  # cu_seqlens' differences, known on the host
) -> torch.Tensor:  # [total_tokens, num_heads, head_dim], contiguous
    if segment_lengths is not None and backend.get_backend() == "auto":
        from hotpath.ops.vision_attention import sdpa

        if sdpa.supported(q):
            return sdpa.varlen_attention(q, k, v, segment_lengths, scale, _triton_run)
    if backend.use_triton(q):
        from hotpath.ops.vision_attention import triton as kernels

        return kernels.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale)
    return reference.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale)


def _triton_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_lengths: list[int],
                scale: float) -> torch.Tensor:
    from hotpath.ops.vision_attention import triton as kernels

    cu = torch.tensor([0] + segment_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return kernels.varlen_attention(q, k, v, cu.to(q.device), max(segment_lengths), scale)


__all__ = ["apply_rotary", "varlen_attention"]
