"""Readable varlen attention without a mask and the rotary before it: the references the Triton
kernels are tested against."""

from __future__ import annotations

import torch


def varlen_attention(
    q: torch.Tensor,  # [total_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [total_tokens, num_heads, head_dim]
    v: torch.Tensor,  # [total_tokens, num_heads, head_dim]
    cu_seqlens: torch.Tensor,  # [num_segments + 1] int32: segment i is tokens cu[i]:cu[i + 1]
    max_seqlen: int,  # longest segment (the kernel sizes its grid from it; unused here)
    scale: float,
) -> torch.Tensor:  # [total_tokens, num_heads, head_dim] in q's dtype
    """softmax(q k^T * scale) v within each segment, in fp32. The segments cover the tokens:
    cu_seqlens[0] == 0 and cu_seqlens[-1] == total_tokens."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    cu = cu_seqlens.tolist()
    for start, end in zip(cu[:-1], cu[1:]):
        if end == start:
            continue
        qs, ks, vs = (x[start:end].float().transpose(0, 1) for x in (q, k, v))  # [heads, len, dim]
        probs = torch.softmax(torch.matmul(qs, ks.transpose(1, 2)) * scale, dim=-1)  # [heads, len, len]
        out[start:end] = torch.matmul(probs, vs).transpose(0, 1).to(q.dtype)
    return out


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, rows, head_dim]: q and k of every head (any token stride)
    cos: torch.Tensor,  # [num_tokens, head_dim] fp32
    sin: torch.Tensor,
) -> torch.Tensor:  # [num_tokens, rows, head_dim] in x's dtype, contiguous
    """Rotate-half RoPE over the whole head with a per-token angle table, in fp32 as
    transformers computes the vision towers' (apply_rotary_pos_emb_vision)."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)
