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


def rms_normalize(
    x: torch.Tensor,  # [M, K], un-normalised
    rstd: torch.Tensor,  # [M] fp32, 1 / RMS of each row (with eps)
    weight: torch.Tensor,  # [K]
) -> torch.Tensor:  # [M, K]
    """RMSNorm from a precomputed statistic, rounding as the reference RMSNorm rounds."""
    return weight * (x.float() * rstd[:, None]).to(x.dtype)


def add_residual(
    y: torch.Tensor,  # [M, N], a projection's output
    residual: torch.Tensor,  # [M, N], updated in place
    eps: float,
) -> torch.Tensor:  # [M] fp32
    """residual += y (rounded as the reference's residual add); returns the new rows' rstd."""
    residual.copy_(y + residual)
    return torch.rsqrt(residual.float().pow(2).mean(-1) + eps)
