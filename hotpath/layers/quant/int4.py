"""What AWQ and GPTQ share: the checkpoints' nibble packing, and the int4 layout the kernels read.

After loading, both formats hold (see hotpath/ops/quant/reference.py): `qweight` int32 [N, K/8]
in the kernels' interleaved layout (reference.pack_int4_layout), `scales` [N, K/G] in the model
dtype, `qzeros` uint8 [N, K/G], and for GPTQ's act-order `g_idx` int32 [K] (the checkpoint's)
with `perm` int32 [K] (reference.act_order_perm(g_idx): the stored column order), else None."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hotpath.layers.quant.base import LinearMethod
from hotpath.layers.quant.fp8_common import replace_param
from hotpath.ops.quant import (
    gemv_fuses,
    int4_linear,
    int4_linear_add_residual,
    int4_linear_silu_and_mul,
)
from hotpath.ops.quant.reference import act_order_perm, pack_int4_layout

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear
    from hotpath.ops.linear.reference import RmsInput

SEQUENTIAL_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)  # GPTQ's
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's GEMM layout: nibble i holds column 8w + AWQ_ORDER[i]


def pack_int4(q: torch.Tensor, order: Sequence[int] = SEQUENTIAL_ORDER) -> torch.Tensor:
    """[R, C] integers 0..15 -> int32 [R, C / 8]: nibble i (bits 4i..4i+3) of word w holds column
    8w + order[i]."""
    R, C = q.shape
    if C % 8:
        raise ValueError(f"int4 packing needs a multiple of 8 columns, got {C}")
    cols = q.to(torch.int64).reshape(R, C // 8, 8)[:, :, list(order)]  # [R, C/8, 8], nibble i's
    shifts = 4 * torch.arange(8, device=q.device, dtype=torch.int64)
    words = ((cols & 0xF) << shifts).sum(-1)  # [R, C/8], 0 .. 2^32 - 1
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_int4(packed: torch.Tensor, order: Sequence[int] = SEQUENTIAL_ORDER) -> torch.Tensor:
    """The inverse of pack_int4: int32 [R, C / 8] -> int32 [R, C], 0..15."""
    R, W = packed.shape
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    nibbles = (packed[:, :, None] >> shifts) & 0xF  # [R, W, 8], nibble i
    cols = torch.empty_like(nibbles)
    cols[:, :, list(order)] = nibbles
    return cols.reshape(R, W * 8)


def effective_group_size(group_size: int, in_features: int) -> int:
    """-1 (one group per row, as AWQ and GPTQ configs spell it) -> in_features."""
    return in_features if group_size == -1 else group_size


def to_int4_layout(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                   g_idx: torch.Tensor | None, dtype: torch.dtype,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q [N, K] (0..15) in input column order, zeros and scales [N, K/G] -> the kernels' layout:
    (qweight [N, K/8], scales in `dtype`, qzeros uint8, perm [K] or None). With g_idx (act-order)
    the columns are sorted by group first."""
    perm = None if g_idx is None else act_order_perm(g_idx, group_size)
    if perm is not None:
        q = q[:, perm.long()]
    return pack_int4_layout(q, group_size), scales.to(dtype), zeros.to(torch.uint8), perm


class Int4LinearMethod(LinearMethod):
    """Runs the int4 layout above; subclasses load their checkpoint layout and convert it."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def _check_shapes(self, layer: Linear, in_features: int) -> int:
        G = effective_group_size(self.group_size, in_features)
        if in_features % G or in_features % 8:
            split = ""
            if getattr(layer, "input_range", None) is not None:
                split = (f" (this tensor-parallel rank's part of {layer.full_in_features}: use a "
                         "tensor-parallel size that splits it into whole groups)")
            raise ValueError(f"int4 quantization: in_features {in_features}{split} must be a "
                             f"multiple of 8 and of the group size {G}")
        for size in layer.output_sizes:
            if size % 8:
                raise ValueError(f"int4 quantization: output parts {layer.output_sizes} must be "
                                 "multiples of 8 (the packing)")
        self.group_size = G
        return G

    def _set_internal(self, layer: Linear, qweight: torch.Tensor, scales: torch.Tensor,
                      qzeros: torch.Tensor, perm: torch.Tensor | None,
                      g_idx: torch.Tensor | None) -> None:
        for name in ("qweight", "scales", "qzeros", "perm", "g_idx"):
            if hasattr(layer, name):
                delattr(layer, name)
        replace_param(layer, "qweight", qweight.contiguous())  # [N, K/8] int32
        replace_param(layer, "scales", scales.contiguous())  # [N, K/G]
        replace_param(layer, "qzeros", qzeros.to(torch.uint8).contiguous())  # [N, K/G]
        for name, t in (("perm", perm), ("g_idx", g_idx)):  # [K] int32 each, act-order only
            setattr(layer, name, None if t is None else
                    torch.nn.Parameter(t.to(torch.int32).contiguous(), requires_grad=False))

    def fuses(self, layer: Linear, x: torch.Tensor) -> bool:
        return gemv_fuses(x)

    def apply(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None,
              out_dtype: torch.dtype | None) -> torch.Tensor:
        return int4_linear(x, layer.qweight, layer.scales, layer.qzeros, self.group_size, layer.perm,
                           layer.bias, rms=rms, out_dtype=out_dtype)

    def apply_silu_and_mul(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None) -> torch.Tensor:
        assert layer.bias is None, "the fused gate_up projections have no bias"
        return int4_linear_silu_and_mul(x, layer.qweight, layer.scales, layer.qzeros, self.group_size,
                                        layer.perm, rms=rms)

    def apply_add_residual(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        assert layer.bias is None, "the fused output projections have no bias"
        return int4_linear_add_residual(x, layer.qweight, layer.scales, layer.qzeros, self.group_size,
                                        layer.perm, residual)
