"""FP8 per-channel weights with per-token dynamic activations (PTPC), from a checkpoint or online.

Checkpoint: compressed-tensors' `float-quantized` format (llm-compressor's FP8_DYNAMIC scheme):
per linear `weight` float8_e4m3fn [N, K] and `weight_scale` [N, 1] (the model's dtype), the
activations quantized per token as the layer runs.

Online (`quantization="fp8"` on a 16-bit checkpoint): each weight is quantized per output row as
its tensor streams in, on the device, so no 16-bit copy of the model is ever held; a row's scale
depends on that row alone, so the fused qkv / gate_up projections quantize part by part. Under
tensor parallelism a row is quantized whole, then narrowed to the rank's part (a row-parallel
rank's columns keep the full row's scale), so every tp size holds the same fp8 weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from hotpath.layers.quant.base import QuantConfig, checkpoint_param, output_shard
from hotpath.layers.quant.fp8_common import (
    FP8_CHECKPOINT_DTYPE,
    Fp8LinearMethod,
    replace_param,
    to_device_fp8,
)
from hotpath.layers.quant.ignore import IgnoreList
from hotpath.ops.quant import fp8_dtype
from hotpath.ops.quant.reference import quantize_fp8_per_token

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear


class Fp8ChannelLinearMethod(Fp8LinearMethod):
    """From a compressed-tensors checkpoint: `weight_scale` loads as [N, 1], runs as [N] fp32."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        layer.weight = checkpoint_param(
            torch.empty(out_features, in_features, dtype=FP8_CHECKPOINT_DTYPE), input_dim=1)  # [N, K]
        layer.weight_scale = checkpoint_param(torch.empty(out_features, 1, dtype=torch.float32))

    def process_weights_after_loading(self, layer: Linear) -> None:
        weight, scale = to_device_fp8(layer.weight.data, layer.weight_scale.data.reshape(-1))
        replace_param(layer, "weight", weight)
        replace_param(layer, "weight_scale", scale.contiguous())  # [N]


class Fp8OnlineLinearMethod(Fp8LinearMethod):
    """Quantizes the checkpoint's 16-bit `weight` per output row as it loads."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        device = torch.empty(0).device
        layer.weight = checkpoint_param(
            torch.empty(out_features, in_features, dtype=fp8_dtype(device)), input_dim=1)  # [N, K]
        layer.weight_scale = checkpoint_param(
            torch.empty(out_features, dtype=torch.float32), from_checkpoint=False)  # [N]

    def load_checkpoint(self, layer: Linear, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        if param is not layer.weight:
            return super().load_checkpoint(layer, param, shard, loaded)
        rows = output_shard(layer, param, shard)
        expected = (layer.full_output_sizes[shard], layer.full_in_features)
        if loaded.shape != expected:
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
        # on the device: the host never holds more than this one checkpoint tensor
        q, scale = quantize_fp8_per_token(loaded.to(rows.device), rows.dtype)  # [N, K], [N]
        if layer.output_ranges is not None or layer.input_range is not None:
            q = layer.rank_part(param, shard, q)
            scale = layer.rank_part(layer.weight_scale, shard, scale)
        rows.copy_(q)
        output_shard(layer, layer.weight_scale, shard).copy_(scale)


class Fp8ChannelConfig(QuantConfig):
    """compressed-tensors' FP8 per-channel checkpoints. MoE experts stay fp8 with their scales
    (hotpath/layers/quant/experts.py)."""

    name = "compressed-tensors"
    expert_tensors = ("weight", "weight_scale")

    def __init__(self, ignore: IgnoreList | None = None) -> None:
        self.ignore = ignore or IgnoreList([])

    def linear_method(self) -> Fp8ChannelLinearMethod:
        return Fp8ChannelLinearMethod()

    def skips(self, module_name: str, shard_names: list[str]) -> bool:
        return self.ignore.skips(module_name, shard_names)


class Fp8OnlineConfig(QuantConfig):
    """`quantization="fp8"` on an unquantized checkpoint: PTPC, quantized while loading. MoE
    experts too, per output row, as each projection's 16-bit weight loads (experts.py)."""

    name = "fp8"
    expert_tensors = ("weight",)

    def linear_method(self) -> Fp8OnlineLinearMethod:
        return Fp8OnlineLinearMethod()
