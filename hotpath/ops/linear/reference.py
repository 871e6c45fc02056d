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


# An RMSNorm to apply to a projection's input, from a statistic gathered before: (partial sums of
# squares [T, M] fp32 of the input rows, summed over T; the norm's weight [K]; its eps)
RmsInput = tuple[torch.Tensor, torch.Tensor, float]


def rms_normalize(
    x: torch.Tensor,  # [M, K], un-normalised
    sumsq: torch.Tensor,  # [T, M] fp32, partial sums of squares of x's rows
    weight: torch.Tensor,  # [K]
    eps: float,
) -> torch.Tensor:  # [M, K]
    """RMSNorm from a precomputed statistic, rounding as the reference RMSNorm rounds."""
    rstd = torch.rsqrt(sumsq.sum(0) / x.shape[-1] + eps)
    return weight * (x.float() * rstd[:, None]).to(x.dtype)


def add_residual(
    y: torch.Tensor,  # [M, N], a projection's output
    residual: torch.Tensor,  # [M, N], updated in place
) -> torch.Tensor:  # [1, M] fp32
    """residual += y (rounded as the reference's residual add); returns the new rows' sums of
    squares, as one partial sum."""
    residual.copy_(y + residual)
    return residual.float().pow(2).sum(-1)[None, :]
