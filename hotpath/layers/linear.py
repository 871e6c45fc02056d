"""Linear layers: the seam for quantization and tensor parallelism.

A `Linear` owns its parameters, fills them from the checkpoint through `checkpoint_tensors` (one
loader per checkpoint tensor, so a fused projection such as qkv or gate_up is filled from its
separate q/k/v or gate/up tensors), and runs through a method object that holds the arithmetic.
The unquantized method is here; the quantized ones (hotpath/layers/quant/) bring their own
parameters and kernels, and a layer built while a quantized model is built takes one
(`current_quant_config`), so the layers above do not change.

Besides the plain projection, a layer offers the fused forms of the few-rows decode chain (see
models/decoder.py): its input RMS-normalised as it loads (`rms=`), SiLU-and-mul fused into a
gate_up projection, and the output added into the residual stream with the new rows' sums of
squares returned. `fuses(x)` says whether it runs them as one kernel for this input; a layer
whose method cannot says no, and the model keeps the unfused path.

Tensor parallelism (`parallel=`, the group read from `current_parallel()` at construction):
"column" splits every stacked projection's outputs over the ranks (rank r holds its part of each
of q/k/v or gate/up; `QKVLinear` splits by heads), "row" splits the inputs and returns the rank's
partial sum, not reduced: the block's caller reduces it fused with the residual add and the next
RMSNorm (models/decoder.py), which is why a row layer under tp > 1 does not fuse its epilogue.
Each rank reads the full checkpoint tensors and `rank_part` narrows them to its part before the
method's `load_weight`, from each parameter's layout metadata (output_dim / pack_factor /
input_dim / input_pack, quant/base.py): the one place that knows how a checkpoint tensor splits,
so every quant method loads its rank's shard as it loads a whole layer (online fp8, whose per-row
scales need the whole row, quantizes first and narrows what it made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn as nn

from hotpath.distributed.parallel_state import GroupCoordinator, current_parallel
from hotpath.layers.quant.base import LinearMethod, checkpoint_param, current_quant_config
from hotpath.ops.linear import linear, linear_add_residual, linear_silu_and_mul, use_gemv
from hotpath.ops.linear.reference import RmsInput

# checkpoint tensor name -> what copies that tensor into the model's parameters
WeightLoaders = dict[str, Callable[[torch.Tensor], None]]

PARALLEL_MODES = ("replicated", "column", "row")


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the model dtype, [out_features, in_features]; hotpath.ops.linear runs them."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        layer.weight = checkpoint_param(torch.empty(out_features, in_features), input_dim=1)  # [N, K]

    def fuses(self, layer: Linear, x: torch.Tensor) -> bool:
        return use_gemv(x, layer.weight)

    def apply(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None,
              out_dtype: torch.dtype | None) -> torch.Tensor:
        return linear(x, layer.weight, layer.bias, rms=rms, out_dtype=out_dtype)

    def apply_silu_and_mul(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None) -> torch.Tensor:
        return linear_silu_and_mul(x, layer.weight, rms=rms)

    def apply_add_residual(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return linear_add_residual(x, layer.weight, residual)


class Linear(nn.Module):
    """y = x @ W^T (+ b), W holding one or more projections stacked along the output dimension.

    `checkpoint_names` names each stacked projection as the checkpoint does (["q_proj", "k_proj",
    "v_proj"] for a qkv_proj); without it the checkpoint's tensor has the module's own name.

    `parallel` (under a tp group of more than one rank; at one rank all three are the same layer):
    "replicated" every rank holds all of it; "column" each stacked projection's outputs split
    evenly over the ranks, or as `shard_ranges` says (this rank's (start, size) in each
    projection's outputs, e.g. whole heads); "row" the inputs split evenly, the output this rank's
    partial sum, its bias added on rank 0 only. `in_features` / `output_sizes` are the full
    layer's; the layer keeps this rank's as `in_features` / `output_sizes` and the full ones as
    `full_in_features` / `full_output_sizes`."""

    def __init__(
        self,
        in_features: int,
        output_sizes: Sequence[int],
        bias: bool = False,
        checkpoint_names: Sequence[str] | None = None,
        method: LinearMethod | None = None,
        parallel: str = "replicated",
        shard_ranges: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        super().__init__()
        if checkpoint_names is not None and len(checkpoint_names) != len(output_sizes):
            raise ValueError("checkpoint_names must name every stacked projection")
        if parallel not in PARALLEL_MODES:
            raise ValueError(f"unknown parallel mode {parallel!r}; choose one of {PARALLEL_MODES}")
        if shard_ranges is not None and parallel != "column":
            raise ValueError("shard_ranges splits a column-parallel Linear's outputs")
        tp = current_parallel().tp
        self.tp = tp
        self.parallel = parallel
        self.full_in_features = in_features
        self.full_output_sizes = list(output_sizes)
        # this rank's (start, size) in each projection's outputs / in the inputs; None: all of them
        self.output_ranges: list[tuple[int, int]] | None = None
        self.input_range: tuple[int, int] | None = None
        if tp.size > 1 and parallel == "column":
            self.output_ranges = _column_ranges(self.full_output_sizes, tp, shard_ranges)
        elif tp.size > 1 and parallel == "row":
            if in_features % tp.size:
                raise ValueError(f"row-parallel Linear: in_features {in_features} does not split "
                                 f"evenly over {tp.size} tensor-parallel ranks")
            size = in_features // tp.size
            self.input_range = (tp.rank * size, size)
            # its epilogue would add a partial sum into the residual before the reduce
            self.fuses = _never_fuses
        self.in_features = in_features if self.input_range is None else self.input_range[1]
        self.output_sizes = (self.full_output_sizes if self.output_ranges is None
                             else [size for _, size in self.output_ranges])
        self.checkpoint_names = None if checkpoint_names is None else list(checkpoint_names)
        if method is None:
            quant = current_quant_config()
            method = UnquantizedLinearMethod() if quant is None else quant.linear_method()
        self.method = method
        self.method.create_weights(self, self.in_features, sum(self.output_sizes))
        self._check_shardable()
        # a row layer's bias is added once, on rank 0, so that the sum over ranks has it once
        self.bias_elsewhere = bias and self.input_range is not None and tp.rank != 0
        self.bias = (checkpoint_param(torch.empty(sum(self.output_sizes)))  # [N]
                     if bias and not self.bias_elsewhere else None)

    def set_method(self, method: LinearMethod) -> None:
        """Replaces the method and its (not yet loaded) parameters: for layers a quantized
        format leaves in the model dtype, found by name after the model is built."""
        for name, _ in list(self.named_parameters(recurse=False)):
            if name != "bias":
                delattr(self, name)
        self.method = method
        method.create_weights(self, self.in_features, sum(self.output_sizes))
        self._check_shardable()

    # ---- loading ------------------------------------------------------------------------------
    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        """{checkpoint tensor name: loader} for this layer, `prefix` being its module path."""
        parent, _, own = prefix.rpartition(".")
        names = self.checkpoint_names or [own]
        loaders: WeightLoaders = {}
        for param_name, param in self.named_parameters(recurse=False):
            if not getattr(param, "from_checkpoint", True):
                continue
            for shard, ckpt in enumerate(names):
                full = f"{parent}.{ckpt}.{param_name}" if parent else f"{ckpt}.{param_name}"
                loaders[full] = partial(self.weight_loader, param, shard)
        if self.bias_elsewhere:  # read, and left to rank 0
            for ckpt in names:
                loaders[f"{parent}.{ckpt}.bias" if parent else f"{ckpt}.bias"] = _skip
        return loaders

    def weight_loader(self, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        """Copies one checkpoint tensor (e.g. k_proj.weight, shard 1) into its part of `param`
        (its rows; for a quantized method, what its layout says): under tp, this rank's part of
        it (`rank_part`, which the method's load_checkpoint applies)."""
        self.method.load_checkpoint(self, param, shard, loaded)

    def rank_part(self, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> torch.Tensor:
        """This rank's part of projection `shard`'s full checkpoint tensor for `param`: its
        outputs (column) or inputs (row), in the packed units the parameter's metadata gives."""
        output_dim = getattr(param, "output_dim", 0)
        if self.output_ranges is not None and output_dim is not None:
            pack = getattr(param, "pack_factor", 1)
            stored = getattr(param, "checkpoint_pack", pack)
            full = self.full_output_sizes[shard]
            if stored != pack:  # finer blocks than the checkpoint's: each of its rows repeated
                loaded = loaded.repeat_interleave(stored // pack, output_dim).narrow(
                    output_dim, 0, -(-full // pack))
            start, size = self.output_ranges[shard]
            loaded = loaded.narrow(output_dim, *_packed_range(start, size, full, pack, "output"))
        input_dim = getattr(param, "input_dim", None)
        if self.input_range is not None and input_dim is not None:
            start, size = self.input_range
            pack = getattr(param, "input_pack", 1)
            loaded = loaded.narrow(input_dim, *_packed_range(start, size, self.full_in_features, pack,
                                                             "input"))
        return loaded

    def load_unsharded(self, param_name: str, full: torch.Tensor) -> None:
        """Fills parameter `param_name` from its value in the same layer built on one rank
        (`full`, the stacked projections' checkpoint tensors side by side): what dummy weights
        use so that every tp size holds slices of the same model (loader/dummy.py)."""
        if param_name == "bias" and self.bias_elsewhere:
            return
        param = getattr(self, param_name)
        output_dim = getattr(param, "output_dim", 0)
        stored = getattr(param, "checkpoint_pack", getattr(param, "pack_factor", 1))
        start = 0
        for shard, size in enumerate(self.full_output_sizes):
            if output_dim is None:
                piece = full[shard]
            else:
                piece = full.narrow(output_dim, start // stored, -(-size // stored))
            self.weight_loader(param, shard, piece)
            start += size

    def _check_shardable(self) -> None:
        """Raises (at construction, naming the sizes) where this rank's part of a parameter would
        not fall on whole packed elements: int4 groups, fp8 blocks, packed words."""
        for name, param in self.named_parameters(recurse=False):
            output_dim = getattr(param, "output_dim", 0)
            try:
                if self.output_ranges is not None and output_dim is not None:
                    pack = getattr(param, "pack_factor", 1)
                    for (start, size), full in zip(self.output_ranges, self.full_output_sizes):
                        _packed_range(start, size, full, pack, "output")
                if self.input_range is not None and getattr(param, "input_dim", None) is not None:
                    _packed_range(*self.input_range, self.full_in_features,
                                  getattr(param, "input_pack", 1), "input")
            except ValueError as e:
                raise ValueError(f"{self.parallel}-parallel Linear over {self.tp.size} ranks "
                                 f"({self.full_in_features} -> {self.full_output_sizes}), "
                                 f"{type(self.method).__name__} parameter {name!r}: {e}") from None

    # ---- running ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, rms: RmsInput | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [..., in] -> [..., out]; with `rms`, of RMSNorm(x) from partial sums of squares (see
        hotpath.ops.linear.linear); stored as `out_dtype` if given."""
        return self.method.apply(self, x, rms, out_dtype)

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether the fused forms below run as one kernel for input `x` (the decode chain's test)."""
        return self.method.fuses(self, x)

    def silu_and_mul(self, x: torch.Tensor, rms: RmsInput | None = None) -> torch.Tensor:
        """For a [gate | up] projection: silu(x @ gate^T) * (x @ up^T), [..., out / 2]."""
        return self.method.apply_silu_and_mul(self, x, rms)

    def add_residual(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual += x @ W^T in place; returns the new rows' partial sums of squares [T, rows]."""
        return self.method.apply_add_residual(self, x, residual)


def _column_ranges(sizes: list[int], tp: GroupCoordinator,
                   shard_ranges: Sequence[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """This rank's (start, size) in each stacked projection's outputs."""
    if shard_ranges is not None:
        ranges = [(int(a), int(n)) for a, n in shard_ranges]
        if len(ranges) != len(sizes) or any(a < 0 or n <= 0 or a + n > s
                                            for (a, n), s in zip(ranges, sizes)):
            raise ValueError(f"shard_ranges {ranges} must give one (start, size) inside each of "
                             f"the output parts {sizes}")
        return ranges
    uneven = [s for s in sizes if s % tp.size]
    if uneven:
        raise ValueError(f"column-parallel Linear: output parts {sizes} do not split evenly over "
                         f"{tp.size} tensor-parallel ranks ({uneven})")
    return [(tp.rank * (s // tp.size), s // tp.size) for s in sizes]


def _packed_range(start: int, size: int, full: int, pack: int, what: str) -> tuple[int, int]:
    """Features [start, start + size) of `full`, stored `pack` to an element -> (first element,
    count). An element spanning all `full` (one quantization group per row) is every rank's."""
    if pack >= full:
        return 0, 1
    if start % pack or (size % pack and start + size != full):
        raise ValueError(f"this rank's {what} features [{start}, {start + size}) of {full} do not "
                         f"fall on whole elements of {pack} (a quantization group, block or "
                         f"packed word)")
    return start // pack, -(-size // pack)


def _never_fuses(x: torch.Tensor) -> bool:
    return False


def _skip(tensor: torch.Tensor) -> None:
    """A checkpoint tensor another rank takes."""


def qkv_head_split(num_heads: int, num_kv_heads: int, tp: GroupCoordinator
                   ) -> tuple[tuple[int, int], tuple[int, int]]:
    """((first query head, count), (first KV head, count)) that rank `tp.rank` holds: the query
    heads split evenly; the KV heads too while there are at least as many as ranks, else each
    replicated over tp / num_kv_heads ranks, a rank taking the one its query heads attend with."""
    if num_heads % tp.size:
        raise ValueError(f"tensor parallelism over {tp.size} ranks needs it to divide the "
                         f"{num_heads} attention heads")
    if num_kv_heads % tp.size and tp.size % num_kv_heads:
        raise ValueError(f"tensor parallelism over {tp.size} ranks with {num_kv_heads} KV heads: "
                         "one must divide the other (KV heads split, or replicated)")
    q = num_heads // tp.size
    if num_kv_heads >= tp.size:
        kv = num_kv_heads // tp.size
        return (tp.rank * q, q), (tp.rank * kv, kv)
    return (tp.rank * q, q), (tp.rank * num_kv_heads // tp.size, 1)


class QKVLinear(Linear):
    """The fused q / k / v projection, column-parallel by whole heads (`qkv_head_split`); it
    keeps this rank's `num_heads` and `num_kv_heads`. `q_head_width`: each query head's outputs
    (2 * head_dim where q_proj also emits a per-head output gate)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        q_head_width: int | None = None,
        checkpoint_names: Sequence[str] = ("q_proj", "k_proj", "v_proj"),
    ) -> None:
        tp = current_parallel().tp
        q_width = head_dim if q_head_width is None else q_head_width
        (q0, nq), (kv0, nkv) = qkv_head_split(num_heads, num_kv_heads, tp)
        ranges = None
        if tp.size > 1:
            ranges = [(q0 * q_width, nq * q_width), (kv0 * head_dim, nkv * head_dim),
                      (kv0 * head_dim, nkv * head_dim)]
        super().__init__(hidden_size, [num_heads * q_width, num_kv_heads * head_dim,
                                       num_kv_heads * head_dim],
                         bias=bias, checkpoint_names=checkpoint_names, parallel="column",
                         shard_ranges=ranges)
        self.num_heads = nq
        self.num_kv_heads = nkv
