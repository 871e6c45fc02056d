"""What the fp8 methods share: running an fp8 weight through hotpath.ops.quant, and the weight's
conversion to the device's fp8 dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from hotpath.layers.quant.base import LinearMethod
from hotpath.ops.quant import (
    fp8_dtype,
    fp8_linear,
    fp8_linear_add_residual,
    fp8_linear_silu_and_mul,
    gemv_fuses,
)
from hotpath.ops.quant.reference import FP8_GEMV_MAX_ROWS, BlockSize

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear
    from hotpath.ops.linear.reference import RmsInput

FP8_CHECKPOINT_DTYPE = torch.float8_e4m3fn  # what every published fp8 checkpoint stores


class Fp8LinearMethod(LinearMethod):
    """Runs `layer.weight` (fp8 [N, K]) with the scale parameter named `scale_name`: per channel
    ([N] fp32) when `block_size` is None, else per block."""

    block_size: BlockSize | None = None
    scale_name = "weight_scale"

    def _scale(self, layer: Linear) -> torch.Tensor:
        return getattr(layer, self.scale_name)

    def fuses(self, layer: Linear, x: torch.Tensor) -> bool:
        return gemv_fuses(x, FP8_GEMV_MAX_ROWS)

    def apply(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None,
              out_dtype: torch.dtype | None) -> torch.Tensor:
        return fp8_linear(x, layer.weight, self._scale(layer), self.block_size, layer.bias,
                          rms=rms, out_dtype=out_dtype)

    def apply_silu_and_mul(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None) -> torch.Tensor:
        assert layer.bias is None, "the fused gate_up projections have no bias"
        return fp8_linear_silu_and_mul(x, layer.weight, self._scale(layer), self.block_size, rms=rms)

    def apply_add_residual(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        assert layer.bias is None, "the fused output projections have no bias"
        return fp8_linear_add_residual(x, layer.weight, self._scale(layer), self.block_size, residual)


def to_device_fp8(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3fn weight and its fp32 scale as the device's fp8 dtype reads them. On MI300 (e4m3fnuz,
    exponent bias one higher) the same bits mean half the value, so the scale doubles; the bit
    pattern of e4m3fn's -0 is NaN there and becomes 0."""
    target = fp8_dtype(weight.device)
    if target == weight.dtype:
        return weight, scale
    bits = weight.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(target), scale * 2.0


def replace_param(layer: nn.Module, name: str, data: torch.Tensor) -> None:
    setattr(layer, name, nn.Parameter(data, requires_grad=False))
