"""FP8 with 128x128 block scales, as Qwen ships it (Qwen3-8B-FP8, Qwen3-30B-A3B-FP8):
config.json `quant_method: "fp8"`, `weight_block_size: [128, 128]`, `activation_scheme: "dynamic"`;
per linear `weight` float8_e4m3fn [N, K] and `weight_scale_inv` [ceil(N/128), ceil(K/128)] (bf16,
fp16 or fp32; despite its name a multiplier: w = weight * scale of its block). compressed-tensors'
FP8_BLOCK scheme is the same layout with the scale named `weight_scale`.

Activations are quantized per token and 128-column group as the layer runs (dynamic)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hotpath.layers.quant.base import QuantConfig, checkpoint_param
from hotpath.layers.quant.fp8_common import (
    FP8_CHECKPOINT_DTYPE,
    Fp8LinearMethod,
    replace_param,
    to_device_fp8,
)
from hotpath.layers.quant.ignore import IgnoreList
from hotpath.ops.quant.reference import BlockSize

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear


class Fp8BlockLinearMethod(Fp8LinearMethod):
    def __init__(self, block_size: BlockSize, scale_name: str) -> None:
        self.block_size = block_size
        self.scale_name = scale_name

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        bn, bk = self.block_size
        # a fused layer's block scales are its projections' stacked: each must start on a block
        # (checked as it loads: a layer the checkpoint leaves unquantized is reset before that)
        self.misaligned = [size for size in layer.output_sizes[:-1] if size % bn]
        layer.weight = checkpoint_param(
            torch.empty(out_features, in_features, dtype=FP8_CHECKPOINT_DTYPE))  # [N, K]
        scale = torch.empty(-(-out_features // bn), -(-in_features // bk), dtype=torch.float32)
        setattr(layer, self.scale_name, checkpoint_param(scale, pack_factor=bn))  # [N/bn, K/bk]

    def load_weight(self, layer: Linear, param: torch.nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        if self.misaligned:
            raise ValueError(
                f"is fp8 with block scales, but hotpath fuses it with other projections into one "
                f"layer of {layer.output_sizes} output features, and parts of {self.misaligned} "
                f"do not fill whole {self.block_size[0]}-row blocks")
        super().load_weight(layer, param, shard, loaded)

    def process_weights_after_loading(self, layer: Linear) -> None:
        weight, scale = to_device_fp8(layer.weight.data, self._scale(layer).data)
        replace_param(layer, "weight", weight)
        replace_param(layer, self.scale_name, scale)


class Fp8BlockConfig(QuantConfig):
    """MoE experts stay fp8 with their block scales (hotpath/layers/quant/experts.py)."""

    expert_tensors = ("weight", "weight_scale_inv")

    def __init__(self, block_size: BlockSize = (128, 128), ignore: IgnoreList | None = None,
                 scale_name: str = "weight_scale_inv", name: str = "fp8") -> None:
        self.block_size = block_size
        self.ignore = ignore or IgnoreList([])
        self.scale_name = scale_name
        self.name = name
        self.expert_tensors = ("weight", scale_name)

    def linear_method(self) -> Fp8BlockLinearMethod:
        return Fp8BlockLinearMethod(self.block_size, self.scale_name)

    def skips(self, module_name: str, shard_names: list[str]) -> bool:
        return self.ignore.skips(module_name, shard_names)
