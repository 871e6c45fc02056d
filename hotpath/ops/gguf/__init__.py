"""Linear over GGUF weights kept quantized (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): the
torch reference on the CPU, Triton on the GPU (reference.py has the layout, triton_linear.py the
kernel). Rows up to GEMV_MAX_ROWS have the fused forms of the few-rows decode chain (`rms=`
input, SiLU-and-mul, add-residual with the sums of squares; see hotpath.ops.linear)."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.gguf import reference
from hotpath.ops.gguf.reference import (
    FORMATS,
    FORMATS_BY_ID,
    GGUFFormat,
    GGUFWeight,
    empty_weight,
    repack,
)
from hotpath.ops.gguf.triton_linear import GEMV_MAX_ROWS
from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.linear.reference import RmsInput


def gguf_fuses(x: torch.Tensor) -> bool:
    """True when a GGUF linear of x runs the Triton kernel with its fused forms as one launch."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return 0 < rows <= GEMV_MAX_ROWS and backend.use_triton(x)


def gguf_linear(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None = None,
                rms: RmsInput | None = None, out_dtype: torch.dtype | None = None,
                ) -> torch.Tensor:  # [..., N]
    """x @ W^T (+ bias), W the dequantized weight; `rms=`: of RMSNorm(x) (hotpath.ops.linear)."""
    if backend.use_triton(x) and (rms is None or gguf_fuses(x)):
        from hotpath.ops.gguf import triton_linear

        return triton_linear.gguf_linear(x, w, bias, rms=rms, out_dtype=out_dtype)
    if rms is not None:
        x = linear_ref.rms_normalize(x, *rms)
    out = reference.gguf_linear(x, w, bias)
    return out if out_dtype is None else out.to(out_dtype)


def gguf_linear_silu_and_mul(x: torch.Tensor, w: GGUFWeight, rms: RmsInput | None = None,
                             ) -> torch.Tensor:  # [..., N / 2]
    if gguf_fuses(x):
        from hotpath.ops.gguf import triton_linear

        return triton_linear.gguf_linear_silu_and_mul(x, w, rms=rms)
    return silu_and_mul(gguf_linear(x, w, rms=rms))


def gguf_linear_add_residual(x: torch.Tensor, w: GGUFWeight, residual: torch.Tensor,
                             ) -> torch.Tensor:  # [T, M] fp32
    if gguf_fuses(x):
        from hotpath.ops.gguf import triton_linear

        return triton_linear.gguf_linear_add_residual(x, w, residual)
    return linear_ref.add_residual(gguf_linear(x, w), residual)


__all__ = [
    "FORMATS",
    "FORMATS_BY_ID",
    "GEMV_MAX_ROWS",
    "GGUFFormat",
    "GGUFWeight",
    "empty_weight",
    "gguf_fuses",
    "gguf_linear",
    "gguf_linear_add_residual",
    "gguf_linear_silu_and_mul",
    "repack",
]
