"""The sparse MoE block of Qwen2-MoE / Qwen3-MoE (and, with its shared expert, of Qwen3-Next and
Qwen3.5): a router picks top_k of num_experts gated MLPs per token; their outputs, weighted by the
routing probabilities, are summed. The experts' weights are stacked into two contiguous tensors at
load time, so that the fused kernels (hotpath/ops/moe) read any expert by index.

Under tensor parallelism each rank holds every expert's share of the width or, with expert
parallelism, whole experts (`FusedExperts._split`); the router is replicated, so every rank routes
every token alike, and the block returns the rank's partial sum for the decoder's all-reduce."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear, WeightLoaders
from hotpath.layers.quant.base import QuantConfig, copy_checked, current_quant_config
from hotpath.distributed.parallel_state import Parallel, current_parallel, shard_range
from hotpath.layers.quant.experts import (
    ExpertShard,
    fp8_experts,
    fp8_loaders,
    int4_experts,
    int4_loaders,
    rank_part,
)
from hotpath.layers.mlp import GatedMLP
from hotpath.ops.moe import FEW_TOKENS, add_into_residual, fused_moe, route
from hotpath.ops.quant import fp8_dtype


class FusedExperts(nn.Module):
    """num_experts gated MLPs, stacked: w13 [E, 2 * I, H] holds each expert's gate_proj rows then
    its up_proj rows, w2 [E, H, I] its down_proj. The checkpoint keeps one tensor per expert and
    projection (`experts.{e}.gate_proj.weight`), each copied into its slice.

    Built under an fp8 format (hotpath/layers/quant/experts.py), w13 and w2 are fp8 and carry
    fp32 scales, which the fused MoE kernels read as they are: w13_scale [E, 2 * I] and w2_scale
    [E, H] per channel, or per block w13_scale [E, 2 * ceil(I / 128), ceil(H / 128)] (the gate's
    block rows, then the up's) and w2_scale [E, ceil(H / 128), ceil(I / 128)].

    Built under an int4 format (AWQ, GPTQ in plain column order), w13 and w2 are int32 words in
    ops/quant's int4 layout, per expert and projection: w13 [E, 2 * I, H / 8], w2 [E, H, I / 8],
    with scales in the model dtype w13_scales [E, 2 * I, H / G], w2_scales [E, H, I / G] and
    uint8 zero points w13_zeros / w2_zeros of the same shapes (G the format's group size, or
    each projection's whole input for -1), which the fused MoE kernels read as they are.

    Under tp > 1, E and I above are this rank's (`local_experts`, `local_width`; see `_split`),
    and fp8 block scales are in `fp8.block_size` blocks (finer where the rank's width needs it)."""

    _SLICES = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.dtype = torch.get_default_dtype()  # the model dtype
        self._split(current_parallel())
        quant = current_quant_config()
        self.checkpoint_quant = quant if quant is not None and quant.expert_tensors else None

    def _split(self, parallel: Parallel) -> None:
        """This rank's experts and width. Over tp > 1 ranks, either each expert's width is split
        (tensor parallelism: every expert on every rank, w13 the rank's rows of gate and of up,
        w2 its columns) or the experts are (expert parallelism: whole experts, shard_range's
        count a rank, an expert map sending the other ranks' to none). Either way every rank
        routes every token and returns its partial sum, which the decoder's all-reduce adds."""
        tp = parallel.tp
        E, I = self.num_experts, self.intermediate_size
        self.expert_start, self.local_experts = 0, E
        self.width_start, self.local_width = 0, I
        self.register_buffer("expert_map", None, persistent=False)  # [E] int32 under expert parallelism
        if tp.size == 1:
            return
        if parallel.expert_parallel:
            if tp.size > E:
                raise ValueError(f"expert parallelism over {tp.size} ranks needs at least as many "
                                 f"experts, got {E}")
            start, end = shard_range(E, tp.size, tp.rank)
            self.expert_start, self.local_experts = start, end - start
            expert_map = torch.full((E,), -1, dtype=torch.int32)  # [E]: local index or -1
            expert_map[start:end] = torch.arange(end - start, dtype=torch.int32)
            self.register_buffer("expert_map", expert_map, persistent=False)
            return
        if I % tp.size:
            raise ValueError(f"tensor parallelism over {tp.size} ranks must divide the experts' "
                             f"width {I} (or use expert parallelism)")
        self.local_width = I // tp.size
        self.width_start = tp.rank * self.local_width

    def _shard(self, proj: str) -> ExpertShard | None:
        """This rank's part of a checkpoint projection (None: all of it)."""
        if self.local_width == self.intermediate_size:
            return None
        return ExpertShard(1 if proj == "down_proj" else 0, self.width_start, self.local_width)

    @property
    def checkpoint_quant(self) -> QuantConfig | None:
        """The format of the checkpoint's experts (None: the model dtype)."""
        return self._checkpoint_quant

    @checkpoint_quant.setter
    def checkpoint_quant(self, quant: QuantConfig | None) -> None:
        # (re)creates the parameters in the format's layout: the loader sets None, before any
        # loading, for experts a format's ignore list names
        self._checkpoint_quant = quant
        self.fp8 = fp8_experts(quant) if quant is not None else None
        if self.fp8 is not None and self.local_width != self.intermediate_size:
            self.fp8 = self.fp8.for_rank_width(self.local_width)
        self.int4 = int4_experts(quant) if quant is not None else None
        self._create_weights()

    def _create_weights(self) -> None:
        E, H, I = self.local_experts, self.hidden_size, self.local_width
        device = self.w13.device if "w13" in self._parameters else torch.empty(0).device
        for name in list(self._parameters):
            delattr(self, name)
        if self.int4 is not None:
            self._create_int4_weights(device)
            return
        dtype = self.dtype if self.fp8 is None else fp8_dtype(device)
        self.w13 = _param(torch.empty(E, 2 * I, H, dtype=dtype, device=device))
        self.w2 = _param(torch.empty(E, H, I, dtype=dtype, device=device))
        if self.fp8 is not None:
            gate_rows, *k_blocks = self.fp8.scale_shape(I, H)
            self.w13_scale = _param(torch.empty(E, 2 * gate_rows, *k_blocks, dtype=torch.float32,
                                                device=device))
            self.w2_scale = _param(torch.empty(E, *self.fp8.scale_shape(H, I), dtype=torch.float32,
                                               device=device))

    def _create_int4_weights(self, device: torch.device) -> None:
        E, H, I = self.local_experts, self.hidden_size, self.local_width
        group = self.int4.group_size
        for K in (H, I):
            G = K if group == -1 else group
            if K % 8 or K % G:
                split = f" ({I} a rank: down_proj's inputs split over the ranks)" if I != self.intermediate_size else ""
                raise ValueError(f"int4 experts: the projections' inputs ({H} and {I}){split} must be "
                                 f"multiples of 8 and of the group size {group}")
        for name, rows, K in (("w13", 2 * I, H), ("w2", H, I)):
            groups = 1 if group == -1 else K // group
            setattr(self, name, _param(torch.empty(E, rows, K // 8, dtype=torch.int32, device=device)))
            setattr(self, f"{name}_scales", _param(torch.empty(E, rows, groups, dtype=self.dtype, device=device)))
            setattr(self, f"{name}_zeros", _param(torch.empty(E, rows, groups, dtype=torch.uint8, device=device)))

    def _slices(self, expert: int, proj: str) -> tuple[torch.Tensor, ...]:
        """Projection `proj` of (global) `expert`'s part of the weight and, for fp8, of its scale;
        for int4 of its words, scales and zero points."""
        expert -= self.expert_start
        name, half = self._SLICES[proj]
        if self.int4 is not None:
            suffixes = ("", "_scales", "_zeros")
        elif self.fp8 is not None:
            suffixes = ("", "_scale")
        else:
            suffixes = ("",)
        parts = tuple(getattr(self, name + suffix).data[expert] for suffix in suffixes)
        if name == "w13":  # gate then up, each with its own rows of every part
            parts = tuple(part.chunk(2)[half] for part in parts)
        return parts

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        """Every expert's tensors: this rank's experts' load into their slices (the rank's part
        of each), other ranks' (expert parallelism) are read past."""
        local = range(self.expert_start, self.expert_start + self.local_experts)
        projections = [(e, proj) for e in local for proj in self._SLICES]
        if self.fp8 is not None:
            loaders = fp8_loaders(self.fp8, {f"{prefix}.{e}.{proj}": (self._slices(e, proj), self._shard(proj))
                                             for e, proj in projections})
        elif self.int4 is not None:
            loaders = int4_loaders(self.int4, {f"{prefix}.{e}.{proj}": (self._slices(e, proj), self._shard(proj))
                                               for e, proj in projections}, self.dtype)
        else:
            loaders = {f"{prefix}.{e}.{proj}.weight": partial(self.weight_loader, e, proj)
                       for e, proj in projections}
        for e in range(self.num_experts):
            if e not in local:
                loaders.update({f"{prefix}.{e}.{proj}.{suffix}": _read_past
                                for proj in self._SLICES for suffix in self._tensor_suffixes()})
        return loaders

    def _tensor_suffixes(self) -> tuple[str, ...]:
        """The checkpoint tensors of one expert projection (`weight`, its scales...)."""
        if self.int4 is not None:
            return self.int4.expert_tensors
        if self.fp8 is not None and self.fp8.scale_name is not None:
            return ("weight", self.fp8.scale_name)
        return ("weight",)

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        """Fills parameter `param_name` from its value in the same layer built on one rank
        (`full`): dummy weights, the same model at every tp size (loader/dummy.py)."""
        target = getattr(self, param_name).data
        full = full.narrow(0, self.expert_start, self.local_experts)
        if self.local_width == self.intermediate_size:
            copy_checked(target, full)
            return
        name, _, suffix = param_name.partition("_")
        kind = {"": "weight", "scale": "scale", "scales": "scales", "zeros": "zeros"}[suffix]
        shard = self._shard("gate_proj" if name == "w13" else "down_proj")
        halves = 2 if name == "w13" else 1
        rows, cols = (self.local_width, self.hidden_size) if name == "w13" else (self.hidden_size, self.local_width)
        group = None if self.int4 is None else self.int4.group_size
        for e in range(self.local_experts):
            for mine, whole in zip(target[e].chunk(halves), full[e].chunk(halves)):
                copy_checked(mine, rank_part(kind, whole, shard, self.fp8, group, rows, cols))

    def weight_loader(self, expert: int, proj: str, loaded: torch.Tensor) -> None:
        """Copies one expert projection's 16-bit weight (the rank's part) into its slice."""
        shard = self._shard(proj)
        copy_checked(self._slices(expert, proj)[0], loaded if shard is None else shard.narrow(loaded))

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        topk_weights: torch.Tensor,  # [T, k] fp32
        topk_ids: torch.Tensor,  # [T, k] int32
    ) -> torch.Tensor:  # [T, H]
        # with tp > 1: this rank's partial sum (its width, or its experts' terms)
        em = self.expert_map
        if self.int4 is not None:
            return fused_moe(x, self.w13, self.w2, topk_weights, topk_ids, self.w13_scales, self.w2_scales,
                             w13_zeros=self.w13_zeros, w2_zeros=self.w2_zeros, group_size=self.int4.group_size,
                             expert_map=em)
        if self.fp8 is None:
            return fused_moe(x, self.w13, self.w2, topk_weights, topk_ids, expert_map=em)
        return fused_moe(x, self.w13, self.w2, topk_weights, topk_ids, self.w13_scale, self.w2_scale,
                         self.fp8.block_size, expert_map=em)


def _param(data: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(data, requires_grad=False)


def _read_past(tensor: torch.Tensor) -> None:
    """Loader of another rank's expert tensor (expert parallelism): nothing to keep."""


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,  # each expert's
        norm_topk_prob: bool,
        shared_expert_intermediate_size: int = 0,  # 0: no shared expert (Qwen3-MoE)
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        # tp > 1: the router (and the shared expert's gate) replicated, the experts split by
        # width or by expert, the shared expert column / row split: forward returns this rank's
        # partial sum (sigmoid(gate) scales each rank's part of the shared expert alike)
        self.tp_size = current_parallel().tp.size
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size)
        if shared_expert_intermediate_size:
            # Qwen2-MoE's shared expert, every token through it, scaled by a sigmoid gate whose
            # one row rides along with the router's (one projection for both)
            self.gate = Linear(hidden_size, [num_experts, 1], checkpoint_names=["gate", "shared_expert_gate"],
                               parallel="replicated")
            self.shared_expert = GatedMLP(hidden_size, shared_expert_intermediate_size)
        else:
            self.gate = Linear(hidden_size, [num_experts], parallel="replicated")  # the router
            self.shared_expert = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        logits = self.gate(x)  # [T, E (+ 1: the shared expert's gate)], model dtype
        topk_weights, topk_ids = route(logits[:, : self.num_experts], self.top_k, self.norm_topk_prob)
        out = self.experts(x, topk_weights, topk_ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(logits[:, self.num_experts :]) * self.shared_expert(x)
        return out

    def fuses(self, x: torch.Tensor) -> bool:
        if self.tp_size > 1:  # its end adds into the residual, which needs the ranks' sum first
            return False
        # only with a shared expert: there the fused form saves its three element-wise ops; a
        # routed-only block's has as many launches as the plain path's and measured slower
        # (docs/decisions.md, MoE)
        if self.shared_expert is None or not self.shared_expert.fuses(x):
            return False
        return x.shape[0] <= FEW_TOKENS and self.gate.fuses(x)

    def forward_few_rows(
        self,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32, h's partial sums of squares (unused: the norm's launch
        # recomputes them, as the experts' kernels read the normalised rows themselves)
        norm: nn.Module,  # the post-attention RMSNorm
    ) -> torch.Tensor:  # [1, M] fp32, the new h's sums of squares
        """h += moe(norm(h)): the norm, the router (with the shared expert's gate), the routing,
        the experts' two kernels, the shared expert's two projections and one launch adding it
        all into h, where the plain path takes two norms and three element-wise ops more."""
        x = norm(h)
        logits = self.gate(x)
        topk_weights, topk_ids = route(logits[:, : self.num_experts], self.top_k, self.norm_topk_prob)
        out = self.experts(x, topk_weights, topk_ids)
        if self.shared_expert is None:
            return add_into_residual(h, out)
        return add_into_residual(h, out, self.shared_expert(x), logits[:, self.num_experts :])
