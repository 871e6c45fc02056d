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


# A projection's output not yet added into the residual stream its consumer reads: (its fp32
# sums [1, K], not rounded; the [1, K] buffer where the consumer stores the stream with them
# added)
PendingSums = tuple[torch.Tensor, torch.Tensor]


def add_pending(
    x: torch.Tensor,  # [1, K], the residual stream without the pending projection
    pending: PendingSums,
) -> tuple[torch.Tensor, torch.Tensor]:  # the new stream (pending's buffer), [1, 1] fp32
    """The residual add of a projection whose fp32 sums are pending, rounded as the reference
    rounds the projection and the add; the new stream is stored in pending's buffer."""
    sums, residual = pending
    residual.copy_(sums.to(x.dtype) + x)
    return residual, residual.float().pow(2).sum(-1)[None, :]
