"""Rotary position embedding (GPT-NeoX "rotate half" layout, as Qwen and Llama use)."""

from __future__ import annotations

import torch

from hotpath.ops.attention.reference import write_kv_cache
from hotpath.ops.norm.reference import rms_norm


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] fp32: cos in the first half, sin in the second
) -> torch.Tensor:
    rotary_dim = cos_sin_cache.shape[1]
    half = rotary_dim // 2
    cos_sin = cos_sin_cache[positions]  # [num_tokens, rotary_dim]
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if rotary_dim < x.shape[-1]:
        rotated = torch.cat((rotated, xf[..., rotary_dim:]), dim=-1)
    return rotated.to(x.dtype)


def qk_norm_rope_and_cache(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] fp32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    q_norm_weight: torch.Tensor | None = None,  # [head_dim]; Qwen3's per-head RMSNorm, or None
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,  # fp8 cache: k_cache holds k / k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> torch.Tensor:  # q after norm and rotation: [num_tokens, num_heads, head_dim]
    """Everything between the qkv projection and attention: optional per-head RMSNorm of q and k,
    RoPE on both, and the rotated k (rounded to its dtype) with v written into the cache (see
    ops/attention/reference.py for fp8 caches)."""
    if q_norm_weight is not None:
        q = rms_norm(q, q_norm_weight, eps)
        k = rms_norm(k, k_norm_weight, eps)
    q = apply_rotary(q, positions, cos_sin_cache)
    k = apply_rotary(k, positions, cos_sin_cache)
    write_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q
