"""AWQ int4 (AutoAWQ's GEMM layout, as Qwen's -AWQ checkpoints ship it): config.json
`quant_method: "awq"`, `version: "gemm"`, `bits: 4`, `group_size` (128), `zero_point: true`,
`modules_to_not_convert`. Per linear, with K inputs, N outputs and G the group size:

    qweight  int32 [K, N/8]    nibble i of word w in row k: q[k, 8w + AWQ_ORDER[i]]
    qzeros   int32 [K/G, N/8]  the zero points (0..15), packed the same way
    scales   fp16  [K/G, N]
    w[n, k] = (q[k, n] - zero[k // G, n]) * scale[k // G, n]

Every output dimension is the second one (packed for qweight and qzeros), so fused projections
stack along it. After loading, the tensors are repacked into the kernels' int4 layout (int4.py);
MoE experts' as each projection's tensors arrive (int4_expert)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hotpath.layers.quant.base import QuantConfig, checkpoint_param
from hotpath.layers.quant.ignore import IgnoreList
from hotpath.layers.quant.int4 import (
    AWQ_ORDER,
    Int4LinearMethod,
    effective_group_size,
    to_int4_layout,
    unpack_int4,
)

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear


def awq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AWQ's tensors -> (qweight [N, K/8] in the kernels' layout, scales [N, K/G] in `dtype`,
    qzeros uint8 [N, K/G]); group_size: the effective one (K for -1)."""
    q = unpack_int4(qweight, AWQ_ORDER)  # [K, N]
    zeros = unpack_int4(qzeros, AWQ_ORDER)  # [K/G, N]
    return to_int4_layout(q.T, zeros.T, scales.T, group_size, None, dtype)[:3]


class AwqLinearMethod(Int4LinearMethod):
    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        # a row-parallel rank's inputs are whole groups of the full layer's (checked by Linear)
        G_full = effective_group_size(self.group_size, layer.full_in_features)
        G = self._check_shapes(layer, in_features)
        K, N = in_features, out_features
        layer.qweight = checkpoint_param(torch.empty(K, N // 8, dtype=torch.int32), 1, 8,
                                         input_dim=0)  # [K, N/8]
        layer.qzeros = checkpoint_param(torch.empty(K // G, N // 8, dtype=torch.int32), 1, 8,
                                        input_dim=0, input_pack=G_full)  # [K/G, N/8]
        layer.scales = checkpoint_param(torch.empty(K // G, N), 1, input_dim=0,
                                        input_pack=G_full)  # [K/G, N]

    def process_weights_after_loading(self, layer: Linear) -> None:
        qweight, scales, qzeros = awq_to_int4(layer.qweight.data, layer.qzeros.data, layer.scales.data,
                                              self.group_size, layer.scales.dtype)
        self._set_internal(layer, qweight, scales, qzeros, None, None)


class AwqConfig(QuantConfig):
    name = "awq"
    expert_tensors = ("qweight", "qzeros", "scales")

    def __init__(self, group_size: int, ignore: IgnoreList | None = None) -> None:
        self.group_size = group_size
        self.ignore = ignore or IgnoreList([], substrings=True)

    def linear_method(self) -> AwqLinearMethod:
        return AwqLinearMethod(self.group_size)

    def skips(self, module_name: str, shard_names: list[str]) -> bool:
        return self.ignore.skips(module_name, shard_names)

    def int4_expert(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One MoE expert projection's checkpoint tensors (by suffix) -> (qweight, scales in
        `dtype`, qzeros) in the kernels' int4 layout, as its Linear's are converted."""
        K = tensors["qweight"].shape[0]
        G = K if self.group_size == -1 else self.group_size
        return awq_to_int4(tensors["qweight"], tensors["qzeros"], tensors["scales"], G, dtype)
