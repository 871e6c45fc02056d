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


def gated_mlp_accumulate(
    x: torch.Tensor,  # [M, H], the MLP's input before its RMSNorm
    gate_up: torch.Tensor,  # [2I, H] = [gate | up]
    down_t: torch.Tensor,  # [I, H], down_proj's weight transposed
    acc: torch.Tensor,  # [M, H] fp32, += the MLP's output
    rms: RmsInput,
) -> None:
    """acc += down(silu(gate(x')) * up(x')), x' = RMSNorm(x): down_proj's sums in fp32, left for
    the consumer to round (linear_add_norm)."""
    from hotpath.ops.activation.reference import silu_and_mul

    y = silu_and_mul(linear(rms_normalize(x, *rms), gate_up))
    acc += y.float() @ down_t.float()


def linear_add_norm(
    h: torch.Tensor,  # [M, K] the residual stream
    acc: torch.Tensor,  # [M, K] fp32, a projection's sums to add to it
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,  # [N]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    h_out: torch.Tensor,  # [M, K], := h + acc, rounded as the reference's residual add
) -> torch.Tensor:  # [M, N]
    """RMSNorm(h + acc) @ weight^T (+ bias), the new residual stream stored in h_out."""
    h_out.copy_(acc.to(h.dtype) + h)
    sumsq = h_out.float().pow(2).sum(-1)[None, :]
    return linear(rms_normalize(h_out, sumsq, norm_weight, eps), weight, bias)
