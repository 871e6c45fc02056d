"""FP8 with 128x128 block scales, as Qwen ships it (Qwen3-8B-FP8, Qwen3-30B-A3B-FP8):
config.json `quant_method: "fp8"`, `weight_block_size: [128, 128]`, `activation_scheme: "dynamic"`;
per linear `weight` float8_e4m3fn [N, K] and `weight_scale_inv` [ceil(N/128), ceil(K/128)] (bf16,
fp16 or fp32; despite its name a multiplier: w = weight * scale of its block). compressed-tensors'
FP8_BLOCK scheme is the same layout with the scale named `weight_scale`.

Activations are quantized per token and 128-column group as the layer runs (dynamic).

Under tensor parallelism a column-parallel rank's outputs need not start on a 128-row block
(Qwen3-235B-A22B's 1536-wide projections at 8 ranks give 192 rows a rank): the layer then keeps
its scales in finer row blocks, the largest power of 2 dividing 128 and every start and width of
the rank's parts (64 for 192), each checkpoint scale row repeated as it loads (Linear.rank_part
reads `checkpoint_pack`). The same numbers, a few more scales. A row-parallel rank's inputs must
be whole 128-column blocks: the activations are quantized per block, so a finer split would
change the layer's arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

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
        self.block_size = block_size  # what the kernels read (finer rows under tp, see above)
        self.checkpoint_block = block_size
        self.scale_name = scale_name

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        stored_bn, bk = self.checkpoint_block
        bn = stored_bn
        if layer.output_ranges is not None:
            bn = math.gcd(bn, *(v for part in layer.output_ranges for v in part))
        if layer.input_range is not None and any(v % bk for v in layer.input_range):
            start, size = layer.input_range
            raise ValueError(
                f"row-parallel fp8 block-scaled Linear: this rank's inputs [{start}, {start + size}) "
                f"of {layer.full_in_features} are not whole {bk}-column blocks (the activations are "
                f"quantized per block); use a tensor-parallel size that splits {layer.full_in_features} "
                f"into multiples of {bk}")
        self.block_size = (bn, bk)
        # a fused layer's block scales are its projections' stacked: each must start on a block
        # (checked as it loads: a layer the checkpoint leaves unquantized is reset before that)
        self.misaligned = [size for size in layer.output_sizes[:-1] if size % bn]
        layer.weight = checkpoint_param(
            torch.empty(out_features, in_features, dtype=FP8_CHECKPOINT_DTYPE), input_dim=1)  # [N, K]
        scale = torch.empty(-(-out_features // bn), -(-in_features // bk), dtype=torch.float32)
        scale = checkpoint_param(scale, pack_factor=bn, input_dim=1, input_pack=bk)  # [N/bn, K/bk]
        if bn != stored_bn:
            scale.checkpoint_pack = stored_bn
        setattr(layer, self.scale_name, scale)

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
