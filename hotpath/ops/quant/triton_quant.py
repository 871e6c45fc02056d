"""Dynamic fp8 quantization of activations, in Triton.

- `_quantize_fp8_kernel`: a program per (row, group): the largest magnitude of its columns gives
  the scale (amax / fp8 max, floored as reference.py floors it), the columns divided by it
  (IEEE division, so the fp8 rounding matches torch's), clamped and stored as fp8. Per token is
  the case of one group as wide as the row, walked in BLOCK-wide chunks (two passes: the amax,
  then the stores); per group, a 128-wide group is one chunk.
- `_add_rms_norm_fp8_kernel`: a program per row: summed = x + residual (stored, the new residual
  stream), RMSNorm of it rounded as hotpath.ops.norm's reference rounds, then that row quantized
  per token as above. The row is held in registers (hidden sizes up to 16K), so the norm reads
  its inputs once.

The fp8 dtype is the output tensor's (e4m3fn, or e4m3fnuz on AMD's gfx942); FP8_MAX is its
largest value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.quant import reference
from hotpath.ops.triton_utils import row_warps

# columns a per-token program reads at a time
TOKEN_BLOCK = 2048


@triton.jit
def _scale_of(amax, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    return tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE)


@triton.jit
def _round_to_e4m3(q, MIN_EXP: tl.constexpr):
    """q (fp32, |q| <= the fp8 max) rounded to the nearest e4m3 value, ties to even: the 3-bit
    mantissa in the integer bits for normal values (a carry moves into the exponent), a
    multiple of the subnormal step 2^(MIN_EXP - 3) below 2^MIN_EXP (fp32 addition rounds it).
    The cast to fp8 that follows is then exact: the interpreter's own rounding carries no
    overflow into the exponent (126.5 became 64) and ignores the sticky bits."""
    bits = q.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    step: tl.constexpr = 1.5 * 2.0 ** (20 + MIN_EXP)
    magnitude = ((tl.abs(q) + step) - step).to(tl.int32, bitcast=True)
    # the sign bit copied as bits (a negative value rounding to zero is -0, as torch rounds it;
    # the GPU compiler turned a select of the negation into +0); e4m3fnuz has no -0 (its bits
    # are NaN), so there a zero keeps no sign
    sign = (bits >> 31) << 31
    if MIN_EXP == -7:
        sign = tl.where(magnitude == 0, 0, sign)
    subnormal = (magnitude | sign).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(q) < 2.0**MIN_EXP, subnormal, normal)


@triton.jit
def _to_fp8(x, scale, FP8_MAX: tl.constexpr, dtype: tl.constexpr):
    q = tl.math.div_rn(x, scale)
    q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    # e4m3fn's smallest normal exponent is -6, e4m3fnuz's (bias 8) -7
    return _round_to_e4m3(q, -7 if dtype == tl.float8e4b8 else -6).to(dtype)


@triton.jit
def _quantize_fp8_kernel(
    x_ptr,  # [M, K]
    out_ptr,  # [M, K] fp8
    scale_ptr,  # [M, num_groups] fp32
    K,
    stride_xm,
    stride_om,
    num_groups,
    GROUP: tl.constexpr,  # columns per group (a multiple of BLOCK), or 0: the whole row
    BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    row = tl.program_id(0)
    g = tl.program_id(1)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    o_row = out_ptr + row.to(tl.int64) * stride_om
    if GROUP == 0:
        start, end = 0, K
    else:
        start = g * GROUP
        end = tl.minimum(start + GROUP, K)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(start, end, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + rk, mask=rk < end, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = _scale_of(tl.max(amax, axis=0), FP8_MAX, MIN_SCALE)
    for k0 in range(start, end, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + rk, mask=rk < end, other=0.0).to(tl.float32)
        tl.store(o_row + rk, _to_fp8(x, scale, FP8_MAX, out_ptr.dtype.element_ty), mask=rk < end)
    tl.store(scale_ptr + row * num_groups + g, scale)


@triton.jit
def _add_rms_norm_fp8_kernel(
    x_ptr,  # [M, H]
    residual_ptr,  # [M, H]
    weight_ptr,  # [H]
    out_ptr,  # [M, H] fp8
    scale_ptr,  # [M] fp32
    summed_ptr,  # [M, H]
    H,
    eps,
    stride_xm,
    stride_rm,
    stride_om,
    stride_sm,
    BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    rk = tl.arange(0, BLOCK)
    mask = rk < H
    x = tl.load(x_ptr + row * stride_xm + rk, mask=mask, other=0.0)
    r = tl.load(residual_ptr + row * stride_rm + rk, mask=mask, other=0.0)
    dtype = x.dtype
    # rounded as torch's x + residual in the model dtype
    summed = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
    tl.store(summed_ptr + row * stride_sm + rk, summed, mask=mask)
    s = summed.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
    w = tl.load(weight_ptr + rk, mask=mask, other=0.0).to(tl.float32)
    normed = ((s * rstd).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
    scale = _scale_of(tl.max(tl.abs(normed), axis=0), FP8_MAX, MIN_SCALE)
    tl.store(out_ptr + row * stride_om + rk, _to_fp8(normed, scale, FP8_MAX, out_ptr.dtype.element_ty),
             mask=mask)
    tl.store(scale_ptr + row, scale)


def _check_2d(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"{name} must be [rows, columns], got shape {tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def _quantize(x: torch.Tensor, group: int, out_dtype: torch.dtype, num_groups: int):
    x = _check_2d(x, "x")
    M, K = x.shape
    out = torch.empty((M, K), dtype=out_dtype, device=x.device)  # [M, K] fp8
    scale = torch.empty((M, num_groups), dtype=torch.float32, device=x.device)  # [M, groups]
    if M == 0 or K == 0:
        return out, scale
    fmax = reference.fp8_max(out_dtype)
    block = group if group else min(TOKEN_BLOCK, triton.next_power_of_2(K))
    _quantize_fp8_kernel[(M, num_groups)](
        x, out, scale, K, x.stride(0), out.stride(0), num_groups,
        GROUP=group, BLOCK=block, FP8_MAX=fmax, MIN_SCALE=reference.MIN_SCALE_FACTOR / fmax,
        num_warps=row_warps(block),
    )
    return out, scale


def quantize_fp8_per_token(
    x: torch.Tensor,  # [M, K]
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M] fp32
    out, scale = _quantize(x, 0, out_dtype, 1)
    return out, scale.view(-1)


def quantize_fp8_per_group(
    x: torch.Tensor,  # [M, K]
    group: int,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M, ceil(K / group)] fp32
    if group < 16 or group & (group - 1):
        raise ValueError(f"the activation group must be a power of 2 of at least 16, got {group}")
    return _quantize(x, group, out_dtype, triton.cdiv(x.shape[-1], group))


def fused_add_rms_norm_fp8(
    x: torch.Tensor,  # [M, H]
    residual: torch.Tensor,  # [M, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [M, H] fp8, [M] fp32, [M, H]
    x = _check_2d(x, "x")
    residual = _check_2d(residual, "residual")
    if residual.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"x {tuple(x.shape)}, residual {tuple(residual.shape)} and the norm "
                         f"weight {tuple(weight.shape)} do not match")
    M, H = x.shape
    out = torch.empty((M, H), dtype=out_dtype, device=x.device)  # [M, H] fp8
    scale = torch.empty(M, dtype=torch.float32, device=x.device)  # [M]
    summed = torch.empty_like(x)  # [M, H]
    if M == 0:
        return out, scale, summed
    fmax = reference.fp8_max(out_dtype)
    block = triton.next_power_of_2(H)
    _add_rms_norm_fp8_kernel[(M,)](
        x, residual, weight, out, scale, summed, H, eps,
        x.stride(0), residual.stride(0), out.stride(0), summed.stride(0),
        BLOCK=block, FP8_MAX=fmax, MIN_SCALE=reference.MIN_SCALE_FACTOR / fmax,
        num_warps=row_warps(block),
    )
    return out, scale, summed
