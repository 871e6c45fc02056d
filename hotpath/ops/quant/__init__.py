"""Quantized linear ops (fp8 per-channel and block-scaled weights, int4 AWQ / GPTQ weights) and
the dynamic fp8 quantization of activations: the torch reference on the CPU, Triton on the GPU
(see hotpath/ops/backend.py and reference.py for the layouts).

Rows up to GEMV_MAX_ROWS (int4; FP8_GEMV_MAX_ROWS for fp8) run a GEMV that reads the quantized
weight and dequantizes it in registers, x staying in its own dtype; it has the fused forms of the
few-rows decode chain (`rms=` input, SiLU-and-mul, add-residual with the sums of squares; see
hotpath.ops.linear), and `gemv_fuses(x, max_rows)` says whether a call runs them as one kernel.
More rows run a tensor-core GEMM: fp8 x fp8 with x quantized per token (per-channel weights,
scales in the epilogue) or per token and 128-column group (block weights, scales in the main
loop); int4 weights run triton_int4's tensor-core GEMV (with the same fused forms) and GEMM.
"""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.quant import reference
from hotpath.ops.quant.reference import FP8_GEMV_MAX_ROWS, GEMV_MAX_ROWS, BlockSize

_GEMV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def fp8_dtype(device: torch.device) -> torch.dtype:
    """The fp8 dtype weights and activations take on `device`: e4m3fn, except on AMD's gfx942
    (MI300), whose hardware fp8 is e4m3fnuz (exponent bias 8, no negative zero, max 240)."""
    if device.type == "cuda" and torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def gemv_fuses(x: torch.Tensor, max_rows: int = GEMV_MAX_ROWS) -> bool:
    """True when a quantized linear of x runs the Triton GEMV (up to `max_rows` rows: the int4
    GEMV's GEMV_MAX_ROWS, fp8's FP8_GEMV_MAX_ROWS), and so its fused forms (`rms=`, silu_and_mul,
    add_residual) run as one kernel each."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return 0 < rows <= max_rows and x.dtype in _GEMV_DTYPES and backend.use_triton(x)


# ---- activation quantization --------------------------------------------------------------------
def quantize_fp8_per_token(
    x: torch.Tensor,  # [M, K]
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M] fp32
    """x ~ x_fp8 * scale[:, None], scale = amax(|row|) / fp8 max (floored); `out_dtype` defaults
    to fp8_dtype(x.device)."""
    out_dtype = out_dtype or fp8_dtype(x.device)
    if backend.use_triton(x):
        from hotpath.ops.quant import triton_quant

        return triton_quant.quantize_fp8_per_token(x, out_dtype)
    return reference.quantize_fp8_per_token(x, out_dtype)


def quantize_fp8_per_group(
    x: torch.Tensor,  # [M, K]
    group: int = reference.ACT_GROUP,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M, ceil(K / group)] fp32
    """Per token and `group`-column group: x ~ x_fp8 * scale[:, k // group]."""
    out_dtype = out_dtype or fp8_dtype(x.device)
    if backend.use_triton(x):
        from hotpath.ops.quant import triton_quant

        return triton_quant.quantize_fp8_per_group(x, group, out_dtype)
    return reference.quantize_fp8_per_group(x, group, out_dtype)


def fused_add_rms_norm_fp8(
    x: torch.Tensor,  # [M, H]
    residual: torch.Tensor,  # [M, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [M, H] fp8, [M] fp32, [M, H]
    """(per-token fp8 of RMSNorm(x + residual), its scales, x + residual) in one pass."""
    out_dtype = out_dtype or fp8_dtype(x.device)
    if backend.use_triton(x):
        from hotpath.ops.quant import triton_quant

        return triton_quant.fused_add_rms_norm_fp8(x, residual, weight, eps, out_dtype)
    return reference.fused_add_rms_norm_fp8(x, residual, weight, eps, out_dtype)


def fp8_gemm(
    a: torch.Tensor,  # [M, K] fp8, quantized activations (e.g. from fused_add_rms_norm_fp8)
    a_scale: torch.Tensor,  # [M] fp32, or [M, ceil(K / block_k)] with block_size
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # [M, N]
    """The fp8 GEMM path of fp8_linear on activations quantized already."""
    if backend.use_triton(a):
        from hotpath.ops.quant import triton_gemm

        return triton_gemm.fp8_gemm(a, a_scale, weight, weight_scale, block_size, bias, out_dtype)
    return reference.fp8_gemm(a, a_scale, weight, weight_scale, block_size, bias, out_dtype)


# ---- fp8 weights --------------------------------------------------------------------------------
def fp8_linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,  # [N] fp32, or [ceil(N / bn), ceil(K / bk)] with block_size
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,  # [N]
    rms: RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., N]
    """x @ W^T (+ bias) in x's dtype, W the dequantized fp8 weight. `rms` takes the few-rows
    chain's statistic (see hotpath.ops.linear.linear); `out_dtype` stores the result as another
    dtype (fp32 logits)."""
    if backend.use_triton(x):
        from hotpath.ops.quant import triton_gemm, triton_gemv

        if gemv_fuses(x, FP8_GEMV_MAX_ROWS):
            return triton_gemv.fp8_linear(x, weight, weight_scale, block_size, bias, rms=rms,
                                          out_dtype=out_dtype)
        if rms is None:
            out = triton_gemm.fp8_linear(x, weight, weight_scale, block_size, bias)
            return out if out_dtype is None else out.to(out_dtype)
    return reference.fp8_linear(x, weight, weight_scale, block_size, bias, rms, out_dtype)


def fp8_linear_silu_and_mul(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [2I, K] fp8 = [gate | up]
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    rms: RmsInput | None = None,
) -> torch.Tensor:  # [..., I]
    """silu(x @ gate^T) * (x @ up^T): one launch where the GEMV runs."""
    if gemv_fuses(x, FP8_GEMV_MAX_ROWS):
        from hotpath.ops.quant import triton_gemv

        return triton_gemv.fp8_linear_silu_and_mul(x, weight, weight_scale, block_size, rms=rms)
    return silu_and_mul(fp8_linear(x, weight, weight_scale, block_size, rms=rms))


def fp8_linear_add_residual(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    residual: torch.Tensor,  # [M, N], updated in place
) -> torch.Tensor:  # [T, M] fp32 partial sums of squares of the new residual rows
    """residual += x @ W^T; returns the new rows' sums of squares (hotpath.ops.linear's protocol)."""
    if gemv_fuses(x, FP8_GEMV_MAX_ROWS):
        from hotpath.ops.quant import triton_gemv

        return triton_gemv.fp8_linear_add_residual(x, weight, weight_scale, block_size, residual)
    return linear_ref.add_residual(fp8_linear(x, weight, weight_scale, block_size), residual)


# ---- int4 weights -------------------------------------------------------------------------------
# The layout (reference.py): qweight in the kernels' interleaved order, `perm` the stored column
# order under GPTQ's act-order (else None). Every row count runs triton_int4 on the tensor cores.
def int4_linear(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,  # [N, K / 8] int32
    scales: torch.Tensor,  # [N, K / G] model dtype
    qzeros: torch.Tensor,  # [N, K / G] uint8
    group_size: int,
    perm: torch.Tensor | None = None,  # [K] int32
    bias: torch.Tensor | None = None,  # [N]
    rms: RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., N]
    """x @ W^T (+ bias) in x's dtype, W the dequantized int4 weight."""
    if backend.use_triton(x):
        from hotpath.ops.quant import triton_int4

        if gemv_fuses(x):
            return triton_int4.int4_linear(x, qweight, scales, qzeros, group_size, perm, bias,
                                           rms=rms, out_dtype=out_dtype)
        if rms is None:
            out = triton_int4.int4_gemm(x, qweight, scales, qzeros, group_size, perm, bias)
            return out if out_dtype is None else out.to(out_dtype)
    return reference.int4_linear(x, qweight, scales, qzeros, group_size, perm, bias, rms,
                                 out_dtype)


def int4_linear_silu_and_mul(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,  # [2I, K / 8] = [gate | up]
    scales: torch.Tensor,
    qzeros: torch.Tensor,
    group_size: int,
    perm: torch.Tensor | None = None,
    rms: RmsInput | None = None,
) -> torch.Tensor:  # [..., I]
    if gemv_fuses(x):
        from hotpath.ops.quant import triton_int4

        return triton_int4.int4_linear_silu_and_mul(x, qweight, scales, qzeros, group_size, perm,
                                                    rms=rms)
    return silu_and_mul(int4_linear(x, qweight, scales, qzeros, group_size, perm, rms=rms))


def int4_linear_add_residual(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [N, K / 8]
    scales: torch.Tensor,
    qzeros: torch.Tensor,
    group_size: int,
    perm: torch.Tensor | None,
    residual: torch.Tensor,  # [M, N], updated in place
) -> torch.Tensor:  # [T, M] fp32
    if gemv_fuses(x):
        from hotpath.ops.quant import triton_int4

        return triton_int4.int4_linear_add_residual(x, qweight, scales, qzeros, group_size, perm,
                                                    residual)
    return linear_ref.add_residual(int4_linear(x, qweight, scales, qzeros, group_size, perm),
                                  residual)


__all__ = [
    "FP8_GEMV_MAX_ROWS",
    "GEMV_MAX_ROWS",
    "fp8_dtype",
    "fp8_gemm",
    "fp8_linear",
    "fp8_linear_add_residual",
    "fp8_linear_silu_and_mul",
    "fused_add_rms_norm_fp8",
    "gemv_fuses",
    "int4_linear",
    "int4_linear_add_residual",
    "int4_linear_silu_and_mul",
    "quantize_fp8_per_group",
    "quantize_fp8_per_token",
]
