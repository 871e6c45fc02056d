"""Linear projection: out = x @ weight^T (+ bias), as torch computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(
    x: torch.Tensor,  # [..., in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [..., out_features]
    return F.linear(x, weight, bias)


def rms_norm_linear(
    x: torch.Tensor,  # [num_tokens, K]
    residual: torch.Tensor | None,  # [num_tokens, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(x + residual)), x + residual); the norm through the norm ops' dispatch."""
    from hotpath.ops.norm import fused_add_rms_norm, rms_norm

    if residual is None:
        return linear(rms_norm(x, norm_weight, eps), weight, bias), x
    normed, summed = fused_add_rms_norm(x, residual, norm_weight, eps)
    return linear(normed, weight, bias), summed


def silu_mul_linear(
    gate_up: torch.Tensor,  # [num_tokens, 2 * K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    from hotpath.ops.activation import silu_and_mul

    return linear(silu_and_mul(gate_up), weight, bias)
