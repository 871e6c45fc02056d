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
from hotpath.ops.quant.reference import (
    BlockSize,
    pack_int4_layout,
    quantize_fp8_per_token,
    unpack_int4_layout,
)

Loader = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class ExpertShard:
    """This rank's part of one expert projection under tensor parallelism: `size` of its `dim`
    (0: output rows, gate_proj / up_proj; 1: input columns, down_proj) from `start`."""

    dim: int
    start: int
    size: int

    def narrow(self, t: torch.Tensor) -> torch.Tensor:
        return t.narrow(self.dim, self.start, self.size)


@dataclass(frozen=True)
class Fp8Experts:
    """How a format's experts are fp8."""

    block_size: BlockSize | None  # the kernels' scale blocks; None: a scale per output row
    scale_name: str | None  # the checkpoint's scale suffix; None: quantized while loading
    checkpoint_block: BlockSize | None = None  # the checkpoint's blocks, where they differ

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """The fp32 scale of one [rows, cols] projection as the kernels read it."""
        if self.block_size is None:
            return (rows,)
        bn, bk = self.block_size
        return (-(-rows // bn), -(-cols // bk))

    def for_rank_width(self, width: int) -> Fp8Experts:
        """The layout of a rank's experts under tensor parallelism, each `width` of the expert
        width: block scales in blocks that divide it (a rank's part of a 128-block would
        otherwise share its scales with another rank's; e.g. Qwen3-235B-A22B-FP8's 1536 at TP8,
        192 a rank, in 64 x 64 blocks), each block's scale its checkpoint block's."""
        if self.block_size is None or all(width % b == 0 for b in self.block_size):
            return self
        blocks = []
        for b in self.block_size:
            while width % b:
                b //= 2
            if b < 16:
                raise ValueError(f"fp8 block-scale experts of width {width} a rank: the fused MoE "
                                 f"kernels need scale blocks of a power of 2 of at least 16 that divide "
                                 f"it (use a tensor-parallel size that leaves a multiple of 16, or "
                                 f"expert parallelism)")
            blocks.append(b)
        return Fp8Experts(tuple(blocks), self.scale_name, self.block_size)


def fp8_experts(config: QuantConfig) -> Fp8Experts | None:
    """The fp8 layout `config`'s experts keep, or None where they are not fp8."""
    if isinstance(config, Fp8BlockConfig):
        return Fp8Experts(config.block_size, config.scale_name)
    if isinstance(config, Fp8ChannelConfig):
        return Fp8Experts(None, "weight_scale")
    if isinstance(config, Fp8OnlineConfig):
        return Fp8Experts(None, None)
    return None


# an expert projection's checkpoint name (`{...}.experts.3.up_proj`) -> its slices of the stacked
# parameters and this rank's part of it (None: all of it)
Projections = dict[str, tuple[tuple[torch.Tensor, ...], ExpertShard | None]]


def fp8_loaders(fmt: Fp8Experts, projections: Projections) -> dict[str, Loader]:
    """`projections`' slices are (weight [N, K] fp8, scale); returns the loaders of their
    checkpoint tensors."""
    loaders: dict[str, Loader] = {}
    for base, ((weight, scale), shard) in projections.items():
        if fmt.scale_name is None:
            loaders[f"{base}.weight"] = partial(_quantize_into, weight, scale, shard)
        else:
            loaders[f"{base}.weight"] = partial(_copy_fp8, weight, shard)
            loaders[f"{base}.{fmt.scale_name}"] = partial(_copy_scale, fmt, weight, scale, shard)
    return loaders


def _copy_fp8(target: torch.Tensor, shard: ExpertShard | None, loaded: torch.Tensor) -> None:
    if loaded.dtype != FP8_CHECKPOINT_DTYPE:
        raise ValueError(f"is {loaded.dtype}, expected an fp8 checkpoint's {FP8_CHECKPOINT_DTYPE}")
    if shard is not None:
        loaded = shard.narrow(loaded)
    loaded = loaded.to(target.device)
    if target.dtype == torch.float8_e4m3fnuz:
        # the same bits mean half the value there (its scale doubles); e4m3fn's -0 is its NaN
        bits = loaded.view(torch.uint8)
        loaded = torch.where(bits == 0x80, torch.zeros_like(bits), bits).view(target.dtype)
    copy_checked(target, loaded)


def _copy_scale(fmt: Fp8Experts, weight: torch.Tensor, target: torch.Tensor, shard: ExpertShard | None,
                loaded: torch.Tensor) -> None:
    if loaded.dim() == 2 and loaded.shape[1] == 1 and fmt.block_size is None:
        loaded = loaded.view(-1)  # compressed-tensors' per-channel [N, 1]
    if shard is not None and fmt.block_size is not None:
        loaded = _rank_block_scale(loaded, fmt, shard, *weight.shape)
    elif shard is not None and shard.dim == 0:  # per channel: the rank's output rows
        loaded = shard.narrow(loaded)
    factor = 2.0 if weight.dtype == torch.float8_e4m3fnuz else 1.0
    copy_checked(target, loaded.to(target.device, torch.float32) * factor)


def _rank_block_scale(loaded: torch.Tensor, fmt: Fp8Experts, shard: ExpertShard, rows: int,
                      cols: int) -> torch.Tensor:
    """The scales of a rank's [rows, cols] part of a projection in fmt.block_size blocks, from
    the checkpoint's in fmt.checkpoint_block ones: each block lies inside one checkpoint block
    (its sides divide the checkpoint's, the rank's start a multiple of them) and takes its scale."""
    (bn, bk), (cn, ck) = fmt.block_size, fmt.checkpoint_block or fmt.block_size
    r0, c0 = (shard.start, 0) if shard.dim == 0 else (0, shard.start)
    ri = (r0 + torch.arange(-(-rows // bn)) * bn) // cn  # [rank block rows]: checkpoint block rows
    ci = (c0 + torch.arange(-(-cols // bk)) * bk) // ck
    if loaded.dim() != 2 or ri[-1] >= loaded.shape[0] or ci[-1] >= loaded.shape[1]:
        raise ValueError(f"has shape {tuple(loaded.shape)}: too few {cn}x{ck} blocks for rows "
                         f"{r0}..{r0 + rows} and columns {c0}..{c0 + cols}")
    return loaded[ri.to(loaded.device)][:, ci.to(loaded.device)]


def _quantize_into(weight: torch.Tensor, scale: torch.Tensor, shard: ExpertShard | None,
                   loaded: torch.Tensor) -> None:
    # on the device: the host never holds more than this one checkpoint tensor. The whole
    # projection is quantized, then the rank's part taken: a row's scale is the whole row's
    q, s = quantize_fp8_per_token(loaded.to(weight.device), weight.dtype)
    if shard is not None:
        q = shard.narrow(q)
        s = s.narrow(0, shard.start, shard.size) if shard.dim == 0 else s
    copy_checked(weight, q)
    scale.copy_(s)


Int4Config = AwqConfig | GptqConfig


def int4_experts(config: QuantConfig) -> Int4Config | None:
    """`config` where its experts are int4 (it converts each projection: int4_expert), else None."""
    return config if isinstance(config, (AwqConfig, GptqConfig)) else None


def int4_loaders(config: Int4Config, projections: Projections, dtype: torch.dtype) -> dict[str, Loader]:
    """`projections`' slices are (qweight int32 [N, K / 8], scales [N, K / G] in `dtype`, qzeros
    uint8 [N, K / G]); returns the loaders of their checkpoint tensors (`{...}.{suffix}` for each
    of the format's expert_tensors)."""
    loaders: dict[str, Loader] = {}
    for base, (slices, shard) in projections.items():
        pending: dict[str, torch.Tensor] = {}
        for suffix in config.expert_tensors:
            loaders[f"{base}.{suffix}"] = partial(_collect_int4, config, pending, suffix, slices, shard, dtype)
    return loaders


def _collect_int4(config: Int4Config, pending: dict[str, torch.Tensor], suffix: str,
                  slices: tuple[torch.Tensor, torch.Tensor, torch.Tensor], shard: ExpertShard | None,
                  dtype: torch.dtype, tensor: torch.Tensor) -> None:
    # on the device: the host holds one checkpoint tensor at a time
    pending[suffix] = tensor.to(slices[0].device)
    if len(pending) == len(config.expert_tensors):
        converted = config.int4_expert(dict(pending), dtype)
        pending.clear()
        if shard is not None:
            converted = _int4_shard(*converted, shard, config.group_size)
        for target, loaded in zip(slices, converted):
            copy_checked(target, loaded)


def rank_part(kind: str, full: torch.Tensor, shard: ExpertShard, fmt: Fp8Experts | None,
              group_size: int | None, rows: int, cols: int) -> torch.Tensor:
    """This rank's part of one expert projection's parameter as the one-rank layer holds it
    (dummy weights: every tp size the same model): `kind` "weight" (16-bit, fp8, or int4 words
    when group_size is given), "scale" (fp8), "scales" / "zeros" (int4); rows x cols the rank's
    projection."""
    if kind == "weight" and group_size is not None and shard.dim == 1:
        K = 8 * full.shape[1]
        G = K if group_size == -1 else group_size
        q = shard.narrow(unpack_int4_layout(full, G))
        return pack_int4_layout(q, shard.size if group_size == -1 else G)
    if kind == "weight" or (shard.dim == 0 and (kind != "scale" or fmt.block_size is None)):
        return shard.narrow(full)
    if kind == "scale":  # fp8: block scales re-blocked; a channel scale is its output row's
        return full if fmt.block_size is None else _rank_block_scale(full, fmt, shard, rows, cols)
    if group_size == -1:  # int4 scales / zeros of the input columns: whole groups
        return full
    return ExpertShard(1, shard.start // group_size, shard.size // group_size).narrow(full)


def _int4_shard(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, shard: ExpertShard,
                group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rank's part of one converted projection (the int4 layout, whole): its output rows, or
    its input columns (whole groups; the layout's runs depend on K, so repacked)."""
    if shard.dim == 0:
        return shard.narrow(qweight), shard.narrow(scales), shard.narrow(qzeros)
    K = 8 * qweight.shape[1]
    G = K if group_size == -1 else group_size
    q = shard.narrow(unpack_int4_layout(qweight, G))  # [N, size]
    if group_size != -1:  # else one group, the rank's whole input, with the row's scale
        groups = ExpertShard(1, shard.start // G, shard.size // G)
        scales, qzeros = groups.narrow(scales), groups.narrow(qzeros)
    return pack_int4_layout(q, shard.size if group_size == -1 else G), scales, qzeros
