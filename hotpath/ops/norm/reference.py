"""RMSNorm, plain and fused with the residual add, in the order HF transformers computes it; and
LayerNorm fused with the residual add (the vision towers)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual): the normed input of the next sublayer and
    the new residual stream."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def gated_rms_norm(
    x: torch.Tensor,  # [num_tokens, heads, head_dim]
    gate: torch.Tensor,  # [num_tokens, heads, head_dim]
    weight: torch.Tensor,  # [head_dim]
    eps: float,
) -> torch.Tensor:  # [num_tokens, heads * head_dim] in x's dtype
    """rms_norm(x) * weight * silu(gate), per head (Gated DeltaNet's output norm), rounded where
    HF's Qwen3-Next / Qwen3.5 norm rounds: the normalised row to x's dtype, weight * it in the
    promoted dtype, the product with the gate in fp32."""
    dtype = x.dtype
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    out = (weight * normed) * F.silu(gate.float())
    return out.to(dtype).reshape(x.shape[0], -1)


def fused_add_layer_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    bias: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (layer_norm(x + residual), x + residual), the sum in the inputs' dtype as HF adds
    the residual stream."""
    summed = x + residual
    return F.layer_norm(summed, (summed.shape[-1],), weight, bias, eps), summed
