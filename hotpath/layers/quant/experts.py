"""Quantized MoE experts: how a quantized checkpoint's expert projections (one tensor set per
expert and projection, `experts.{e}.gate_proj.weight` + its scales) load into FusedExperts'
stacked parameters (hotpath/layers/moe.py).

- fp8 (`fp8_experts`): the experts stay fp8, as the fused MoE kernels read them (hotpath/ops/moe):
  each projection's weight and scales are copied into their slices of w13 / w2 and w13_scale /
  w2_scale: block scales as Qwen ships them (Qwen3-30B-A3B-FP8's `weight_scale_inv`, or
  compressed-tensors' FP8_BLOCK `weight_scale`), gate and up keeping their own block rows;
  compressed-tensors' per-channel `weight_scale` [N, 1]; and online fp8 (`quantization="fp8"`),
  each 16-bit projection quantized per output row on the device as it loads, as the online
  Linear does. On AMD's gfx942 the weights become e4m3fnuz as they load and the scales double
  (ops/quant.fp8_dtype).
- int4 (AWQ, GPTQ; `int4_experts`): the experts stay int4, in ops/quant's int4 layout, as the
  fused MoE kernels read them: the tensors of each expert projection (qweight, qzeros, scales,
  GPTQ's g_idx) are collected on the device and, once all have arrived, converted by the
  format's own per-projection conversion (awq_to_int4 / gptq_to_int4) and copied into their
  slices of w13 / w2 (words), w13_scales / w2_scales (model dtype) and w13_zeros / w2_zeros
  (uint8). The host holds at most one checkpoint tensor at a time. GPTQ's act-order experts
  (g_idx not in plain group order) are refused: the kernels read experts in plain column order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from hotpath.layers.quant.awq import AwqConfig
from hotpath.layers.quant.base import QuantConfig, copy_checked
from hotpath.layers.quant.fp8_block import Fp8BlockConfig
from hotpath.layers.quant.fp8_channel import Fp8ChannelConfig, Fp8OnlineConfig
from hotpath.layers.quant.fp8_common import FP8_CHECKPOINT_DTYPE
from hotpath.layers.quant.gptq import GptqConfig
from hotpath.ops.quant.reference import BlockSize, quantize_fp8_per_token

Loader = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class Fp8Experts:
    """How a format's experts are fp8."""

    block_size: BlockSize | None  # None: a scale per output row
    scale_name: str | None  # the checkpoint's scale suffix; None: quantized while loading

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """The fp32 scale of one [rows, cols] projection as the kernels read it."""
        if self.block_size is None:
            return (rows,)
        bn, bk = self.block_size
        return (-(-rows // bn), -(-cols // bk))


def fp8_experts(config: QuantConfig) -> Fp8Experts | None:
    """The fp8 layout `config`'s experts keep, or None where they are not fp8."""
    if isinstance(config, Fp8BlockConfig):
        return Fp8Experts(config.block_size, config.scale_name)
    if isinstance(config, Fp8ChannelConfig):
        return Fp8Experts(None, "weight_scale")
    if isinstance(config, Fp8OnlineConfig):
        return Fp8Experts(None, None)
    return None


def fp8_loaders(fmt: Fp8Experts, projections: dict[str, tuple[torch.Tensor, torch.Tensor]]
                ) -> dict[str, Loader]:
    """`projections` maps each expert projection's checkpoint name (`{...}.experts.3.up_proj`)
    to its slices (weight [N, K] fp8, scale); returns the loaders of its checkpoint tensors."""
    loaders: dict[str, Loader] = {}
    for base, (weight, scale) in projections.items():
        if fmt.scale_name is None:
            loaders[f"{base}.weight"] = partial(_quantize_into, weight, scale)
        else:
            loaders[f"{base}.weight"] = partial(_copy_fp8, weight)
            loaders[f"{base}.{fmt.scale_name}"] = partial(_copy_scale, weight.dtype, scale)
    return loaders


def _copy_fp8(target: torch.Tensor, loaded: torch.Tensor) -> None:
    if loaded.dtype != FP8_CHECKPOINT_DTYPE:
        raise ValueError(f"is {loaded.dtype}, expected an fp8 checkpoint's {FP8_CHECKPOINT_DTYPE}")
    loaded = loaded.to(target.device)
    if target.dtype == torch.float8_e4m3fnuz:
        # the same bits mean half the value there (its scale doubles); e4m3fn's -0 is its NaN
        bits = loaded.view(torch.uint8)
        loaded = torch.where(bits == 0x80, torch.zeros_like(bits), bits).view(target.dtype)
    copy_checked(target, loaded)


def _copy_scale(weight_dtype: torch.dtype, target: torch.Tensor, loaded: torch.Tensor) -> None:
    if target.dim() == 1 and loaded.shape == (target.shape[0], 1):
        loaded = loaded.view(-1)  # compressed-tensors' per-channel [N, 1]
    factor = 2.0 if weight_dtype == torch.float8_e4m3fnuz else 1.0
    copy_checked(target, loaded.to(target.device, torch.float32) * factor)


def _quantize_into(weight: torch.Tensor, scale: torch.Tensor, loaded: torch.Tensor) -> None:
    # on the device: the host never holds more than this one checkpoint tensor
    q, s = quantize_fp8_per_token(loaded.to(weight.device), weight.dtype)
    copy_checked(weight, q)
    scale.copy_(s)


Int4Config = AwqConfig | GptqConfig


def int4_experts(config: QuantConfig) -> Int4Config | None:
    """`config` where its experts are int4 (it converts each projection: int4_expert), else None."""
    return config if isinstance(config, (AwqConfig, GptqConfig)) else None


def int4_loaders(config: Int4Config, projections: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 dtype: torch.dtype) -> dict[str, Loader]:
    """`projections` maps each expert projection's checkpoint name (`{...}.experts.3.up_proj`)
    to its slices (qweight int32 [N, K / 8], scales [N, K / G] in `dtype`, qzeros uint8
    [N, K / G]); returns the loaders of its checkpoint tensors (`{...}.{suffix}` for each of the
    format's expert_tensors)."""
    loaders: dict[str, Loader] = {}
    for base, slices in projections.items():
        pending: dict[str, torch.Tensor] = {}
        for suffix in config.expert_tensors:
            loaders[f"{base}.{suffix}"] = partial(_collect_int4, config, pending, suffix, slices, dtype)
    return loaders


def _collect_int4(config: Int4Config, pending: dict[str, torch.Tensor], suffix: str,
                  slices: tuple[torch.Tensor, torch.Tensor, torch.Tensor], dtype: torch.dtype,
                  tensor: torch.Tensor) -> None:
    # on the device: the host holds one checkpoint tensor at a time
    pending[suffix] = tensor.to(slices[0].device)
    if len(pending) == len(config.expert_tensors):
        converted = config.int4_expert(dict(pending), dtype)
        pending.clear()
        for target, loaded in zip(slices, converted):
            copy_checked(target, loaded)
