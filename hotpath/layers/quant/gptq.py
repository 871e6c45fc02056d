"""GPTQ int4 (AutoGPTQ / GPTQModel / optimum checkpoints, Qwen's -GPTQ-Int4): config.json
`quant_method: "gptq"`, `bits: 4`, `group_size`, `desc_act`, `sym`, `checkpoint_format` ("gptq",
the default, or "gptq_v2"). Per linear, with K inputs, N outputs and G the group size:

    qweight  int32 [K/8, N]    nibble j of word w in column n: q[8w + j, n]
    qzeros   int32 [K/G, N/8]  nibble j of word w in row g: zero[g, 8w + j], stored minus 1 in
                               the "gptq" (v1) format, as is in "gptq_v2"
    scales   fp16  [K/G, N]
    g_idx    int32 [K]         input k's group (desc_act: the groups follow the order in which
                               GPTQ quantized the columns; else k // G)
    w[n, k] = (q[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]

Fused projections stack along the second dimension; they share their input, so their g_idx are
the same (checked after loading). After loading, the tensors are repacked into the kernels' int4
layout (int4.py), act-order's columns sorted by group; MoE experts' as each projection's tensors
arrive (int4_expert; plain order only).

Under tensor parallelism a row-parallel rank reads its input rows of qweight and g_idx and every
group's scales and zeros, and keeps the groups its g_idx names (`rank_groups`): in plain order a
contiguous run of them; with act-order (desc_act) whichever groups its columns belong to, its
permutation then built from its own g_idx. The kernels' layout needs each kept group whole on the
rank (group_size columns): an act-order checkpoint whose groups straddle ranks is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hotpath.layers.quant.base import QuantConfig, checkpoint_param
from hotpath.layers.quant.int4 import (
    Int4LinearMethod,
    effective_group_size,
    to_int4_layout,
    unpack_int4,
)

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def gptq_to_int4(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
    group_size: int, v1_zeros: bool, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """GPTQ's tensors -> (qweight [N, K/8] in the kernels' layout, scales [N, K/G] in `dtype`,
    qzeros uint8 [N, K/G], perm [K], g_idx [K]; the last two None where g_idx is the plain
    k // G)."""
    zeros = unpack_int4(qzeros)  # [K/G, N]
    if v1_zeros:
        zeros = (zeros + 1) & 0xF  # v1 stored (zero - 1) & 0xF
    K = qweight.shape[0] * 8
    groups = scales.shape[0]
    g_idx = g_idx.to(torch.int64)
    if g_idx.shape != (K,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise ValueError(f"g_idx must hold {K} group indices below {groups}")
    plain = torch.equal(g_idx, torch.arange(K, device=g_idx.device) // group_size)
    g_idx = None if plain else g_idx.to(torch.int32)
    q = unpack_int4(qweight.T)  # [N, K]: word w of column n packs rows 8w..8w+7
    return (*to_int4_layout(q, zeros.T, scales.T, group_size, g_idx, dtype), g_idx)


def rank_groups(g_idx: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                input_range: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A row-parallel rank's g_idx [K_rank] (the full layer's group numbers), with every group's
    qzeros / scales [groups, ...] -> the groups it uses, renumbered 0.. in their order, and only
    their rows; each must have all its group_size columns on this rank."""
    present, local, counts = torch.unique(g_idx.long(), return_inverse=True, return_counts=True)
    if bool((counts != group_size).any()):
        start, size = input_range
        raise ValueError(f"GPTQ with act-order (desc_act): input columns [{start}, {start + size}) "
                         f"of this tensor-parallel rank hold parts of groups of {group_size} "
                         "columns whose other columns lie on other ranks; hotpath's int4 layout "
                         "needs whole groups on each rank (use a checkpoint without desc_act, or "
                         "fewer ranks)")
    return local.to(torch.int32), qzeros[present], scales[present]


class GptqLinearMethod(Int4LinearMethod):
    def __init__(self, group_size: int, v1_zeros: bool) -> None:
        super().__init__(group_size)
        self.v1_zeros = v1_zeros

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        # a row-parallel rank keeps every group's scales and zeros until its g_idx is known
        groups = layer.full_in_features // effective_group_size(self.group_size, layer.full_in_features)
        self._check_shapes(layer, in_features)
        K, N = in_features, out_features
        layer.qweight = checkpoint_param(torch.empty(K // 8, N, dtype=torch.int32), 1,
                                         input_dim=0, input_pack=8)  # [K/8, N]
        layer.qzeros = checkpoint_param(torch.empty(groups, N // 8, dtype=torch.int32), 1, 8)
        layer.scales = checkpoint_param(torch.empty(groups, N), 1)  # [groups, N]
        # one row per projection: every projection's own copy, compared after loading
        layer.g_idx = checkpoint_param(
            torch.empty(len(layer.output_sizes), K, dtype=torch.int32), output_dim=None,
            input_dim=0)  # [projections, K]

    def process_weights_after_loading(self, layer: Linear) -> None:
        g_idx = layer.g_idx.data
        if not all(torch.equal(g_idx[0], row) for row in g_idx[1:]):
            raise ValueError(f"the projections fused into one layer ({layer.checkpoint_names}) "
                             "have different g_idx; hotpath needs them to share one")
        g_idx, qzeros, scales = g_idx[0], layer.qzeros.data, layer.scales.data
        if layer.input_range is not None:
            g_idx, qzeros, scales = rank_groups(g_idx, qzeros, scales, self.group_size,
                                                layer.input_range)
        converted = gptq_to_int4(layer.qweight.data, qzeros, scales, g_idx, self.group_size,
                                 self.v1_zeros, layer.scales.dtype)
        self._set_internal(layer, *converted)


class GptqConfig(QuantConfig):
    name = "gptq"
    expert_tensors = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, group_size: int, checkpoint_format: str = "gptq") -> None:
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint_format {checkpoint_format!r} is not supported; "
                             f"hotpath reads {', '.join(CHECKPOINT_FORMATS)}")
        self.group_size = group_size
        self.v1_zeros = checkpoint_format == "gptq"

    def linear_method(self) -> GptqLinearMethod:
        return GptqLinearMethod(self.group_size, self.v1_zeros)

    def int4_expert(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One MoE expert projection's checkpoint tensors (by suffix) -> (qweight, scales in
        `dtype`, qzeros) in the kernels' int4 layout, as its Linear's are converted. The fused
        MoE kernels read experts in plain column order: act-order's (desc_act) are refused."""
        K = tensors["qweight"].shape[0] * 8
        G = K if self.group_size == -1 else self.group_size
        qweight, scales, qzeros, perm, _ = gptq_to_int4(
            tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"], G,
            self.v1_zeros, dtype)
        if perm is not None:
            raise ValueError("GPTQ MoE experts quantized with act-order (desc_act: g_idx not in "
                             "plain group order) are not supported: hotpath's fused MoE kernels read "
                             "int4 experts in plain column order; use a checkpoint quantized "
                             "without desc_act")
        return qweight, scales, qzeros
