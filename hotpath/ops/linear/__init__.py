"""Linear projection: the reference (torch / cuBLAS) everywhere, except for the few-row inputs
of decode on a GPU, which run the Triton GEMV kernel (see hotpath/ops/backend.py and
triton_gemv.py)."""

from __future__ import annotations

import math

import torch

from hotpath.ops import backend
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.linear import reference

# The GEMV beats cuBLAS at one row on every shape, at up to 16 rows only on weights no taller than
# wide and at most 32 MB (docs/decisions.md, linear)
GEMV_MAX_ROWS = 16
MULTI_ROW_MAX_WEIGHT_ELEMENTS = 1 << 24
# Two rows on a weight of at most 8M elements work as one row does (FMAs, the tile loading before
# PDL's wait); more rows or larger weights hold too few weight bytes in flight
GEMV_FMA_MAX_ROWS = 2
FMA_MAX_WEIGHT_ELEMENTS = 1 << 23
# fp32 too, so that GPU parity tests in fp32 run the decode path's fused forms
_GEMV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def fma_rows(rows: int, N: int, K: int) -> bool:
    """True where the GEMV kernel sums `rows` rows of an [N, K] weight as it sums one: with FMAs,
    its weight tile loading before PDL's wait (else with tensor cores)."""
    return rows == 1 or (rows <= GEMV_FMA_MAX_ROWS and N * K <= FMA_MAX_WEIGHT_ELEMENTS)


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when linear(x, weight) runs the Triton GEMV kernel."""
    rows = math.prod(x.shape[:-1])
    N, K = weight.shape
    return (
        x.dtype in _GEMV_DTYPES
        and weight.dtype == x.dtype
        and weight.stride(-1) == 1
        and 0 < rows <= GEMV_MAX_ROWS
        and (fma_rows(rows, N, K) or (N <= K and N * K <= MULTI_ROW_MAX_WEIGHT_ELEMENTS))
        and backend.use_triton(x)
    )


def linear(
    x: torch.Tensor,  # [..., in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    bias: torch.Tensor | None = None,  # [out_features]
    rms: reference.RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., out_features]
    """x @ weight^T (+ bias); with `rms`, of RMSNorm(x) from the partial sums of squares that
    linear_add_residual returned for x (fused into the GEMV's loads where it runs). The result
    has x's dtype's values, stored as `out_dtype` (e.g. fp32 logits: the GEMV writes them
    directly, no conversion launch)."""
    if use_gemv(x, weight):
        from hotpath.ops.linear import triton_gemv

        return triton_gemv.linear(x, weight, bias, rms=rms, out_dtype=out_dtype)
    if rms is not None:
        x = reference.rms_normalize(x, *rms)
    out = reference.linear(x, weight, bias)
    return out if out_dtype is None else out.to(out_dtype)


def linear_silu_and_mul(
    x: torch.Tensor,  # [..., in_features]
    weight: torch.Tensor,  # [2 * intermediate, in_features] = [gate | up]
    rms: reference.RmsInput | None = None,
) -> torch.Tensor:  # [..., intermediate]
    """silu(x @ gate^T) * (x @ up^T): one fused launch where the GEMV runs, else the two ops."""
    if use_gemv(x, weight):
        from hotpath.ops.linear import triton_gemv

        return triton_gemv.linear_silu_and_mul(x, weight, rms=rms)
    return silu_and_mul(linear(x, weight, rms=rms))


def linear_add_residual(
    x: torch.Tensor,  # [rows, in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    residual: torch.Tensor,  # [rows, out_features], updated in place
) -> torch.Tensor:  # [T, rows] fp32
    """residual += x @ weight^T; returns partial sums of squares of the new rows (summed over T,
    each row's), gathered in the GEMV's epilogue where it runs, so that the next projection can
    RMS-normalise its input as it loads it (`rms=`) and no RMSNorm kernel runs between them."""
    if use_gemv(x, weight):
        from hotpath.ops.linear import triton_gemv

        return triton_gemv.linear_add_residual(x, weight, residual)
    return reference.add_residual(reference.linear(x, weight), residual)


__all__ = ["linear", "linear_add_residual", "linear_silu_and_mul"]
