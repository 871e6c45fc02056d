"""Rotary position embedding (GPT-NeoX "rotate half" layout, as Qwen and Llama use)."""

from __future__ import annotations

import torch


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
