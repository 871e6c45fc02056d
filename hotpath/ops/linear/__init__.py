"""Linear projection: the reference (torch / cuBLAS) everywhere, except for the few-row inputs
of decode on a GPU, which run the Triton GEMV kernel (see hotpath/ops/backend.py and
triton_gemv.py)."""

from __future__ import annotations

import math

import torch

from hotpath.ops import backend
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.linear import reference

# Where the GEMV kernel was measured faster than cuBLAS back to back with itself (H200, bf16, in
# CUDA graphs, torch 2.11; hotpath.ops.linear.bench): with one row, on every Qwen3-0.6B / -8B
# projection and LM head (1% on 8B's gate_up to 65% on 0.6B's o_proj); with 8 and 16 rows only on
# weights no taller than wide and at most 32 MB (o_proj of both, down_proj of 0.6B: 5-15% less
# time). On the other shapes at 8 and 16 rows cuBLAS took up to 18% less time, or (the LM heads)
# within 3% of the kernel.
GEMV_MAX_ROWS = 16
MULTI_ROW_MAX_WEIGHT_ELEMENTS = 1 << 24
# Two rows on a weight of at most 8M elements work as one row does (FMAs, the weight tile loading
# before PDL's wait, in half-height tiles), on any shape: in the decode graph, batch 2 of
# Qwen3-0.6B (every projection at most 6.3M elements) took 19% less time than with cuBLAS and the
# unfused layer (run K). Each row's products take registers of their own, so an SM holds fewer
# weight bytes in flight: on Qwen3-8B's projections (16.7-101M elements) batch 2 took 10-30% more
# whatever the tiles, and 4 rows of 0.6B 9% more.
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
    zero: torch.Tensor | None = None,  # [rows, out_features] fp32, set to zeros
) -> torch.Tensor:  # [T, rows] fp32
    """residual += x @ weight^T; returns partial sums of squares of the new rows (summed over T,
    each row's), gathered in the GEMV's epilogue where it runs, so that the next projection can
    RMS-normalise its input as it loads it (`rms=`) and no RMSNorm kernel runs between them.
    `zero` is cleared too (in the GEMV's epilogue: the accumulator gated_mlp_accumulate adds to
    next, with no launch of its own)."""
    if use_gemv(x, weight):
        from hotpath.ops.linear import triton_gemv

        return triton_gemv.linear_add_residual(x, weight, residual, zero=zero)
    if zero is not None:
        zero.zero_()
    return reference.add_residual(reference.linear(x, weight), residual)


# The MLP of a decode step of 1-2 rows runs as one kernel (triton_mlp) on MLPs of at most this
# many weight elements (Qwen3-0.6B's 9.4M, Qwen2.5-0.5B's 13M; not Qwen3-1.7B's 38M): all of
# its weight is loading before PDL's wait in one wave of programs
FUSED_MLP_MAX_ELEMENTS = 1 << 24
# ...and hidden sizes up to this (a program holds whole rows of the weights; the next layer's
# qkv GEMV, linear_add_norm, holds whole rows of its input)
FUSED_MLP_MAX_HIDDEN = 4096


def fused_mlp_fits(gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether decode steps run this MLP (gate_up [2I, H], down [H, I]) as one kernel, which
    needs down_proj's weight stored transposed (GatedMLP.transpose_down)."""
    return (
        gate_up.numel() + down.numel() <= FUSED_MLP_MAX_ELEMENTS
        and down.shape[0] <= FUSED_MLP_MAX_HIDDEN
        and gate_up.dtype in _GEMV_DTYPES
        and backend.use_triton(down)
    )


def fused_mlp(x: torch.Tensor, gate_up: torch.Tensor, down_t: torch.Tensor) -> bool:
    """True when gated_mlp_accumulate runs as one Triton kernel for input x: decode rows the GEMV
    sums with FMAs, on an MLP small enough (hotpath.layers.activation.GatedMLP.transpose_down
    decides which MLPs store down_proj transposed for it)."""
    rows = math.prod(x.shape[:-1])
    return (
        x.dtype in _GEMV_DTYPES
        and gate_up.dtype == down_t.dtype == x.dtype
        and gate_up.stride(-1) == down_t.stride(-1) == 1
        and 0 < rows <= GEMV_FMA_MAX_ROWS
        and backend.use_triton(x)
    )


def gated_mlp_accumulate(
    x: torch.Tensor,  # [M, H]
    gate_up: torch.Tensor,  # [2I, H] = [gate | up]
    down_t: torch.Tensor,  # [I, H], down_proj's weight transposed
    acc: torch.Tensor,  # [M, H] fp32, += the MLP's output (unrounded)
    rms: reference.RmsInput,
) -> None:
    """acc += down(silu(gate(x')) * up(x')), x' = RMSNorm(x) from the statistic's partial sums:
    one kernel where `fused_mlp` holds (see triton_mlp), else the reference ops."""
    if fused_mlp(x, gate_up, down_t):
        from hotpath.ops.linear import triton_mlp

        return triton_mlp.gated_mlp_accumulate(x, gate_up, down_t, acc, rms)
    return reference.gated_mlp_accumulate(x, gate_up, down_t, acc, rms)


def linear_add_norm(
    h: torch.Tensor,  # [M, K] the residual stream
    acc: torch.Tensor,  # [M, K] fp32 sums of a projection (gated_mlp_accumulate's) to add to it
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,  # [N]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    h_out: torch.Tensor,  # [M, K] := h + acc (rounded as the reference's residual add)
) -> torch.Tensor:  # [M, N]
    """RMSNorm(h + acc) @ weight^T (+ bias), the new residual stream stored in h_out: in the GEMV
    where it holds all of K in one tile (each program adds and normalises whole rows itself, so
    it needs no statistic from a producer), else the reference ops."""
    if use_gemv(h, weight) and whole_rows(h, weight):
        from hotpath.ops.linear import triton_gemv

        return triton_gemv.linear_add_norm(h, acc, weight, bias, norm_weight, eps, h_out)
    return reference.linear_add_norm(h, acc, weight, bias, norm_weight, eps, h_out)


def whole_rows(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True where the GEMV's programs hold whole rows of x: one-row (FMA) sums over one K tile."""
    from hotpath.ops.linear import triton_gemv

    N, K = weight.shape
    return fma_rows(math.prod(x.shape[:-1]), N, K) and K <= triton_gemv.WHOLE_K


__all__ = ["fused_mlp_fits", "gated_mlp_accumulate", "linear", "linear_add_norm", "linear_add_residual",
           "linear_silu_and_mul"]
