"""The interface of quantized linear layers.

A `QuantConfig` is what a checkpoint's `quantization_config` says (or `quantization="fp8"` for
online quantization). While a model is built inside `building_with(config)`, every `Linear` takes
its method from it (`current_linear_method`); after construction, the loader sets the layers that
the format leaves unquantized (its ignore list, MoE routers) back to the plain method
(hotpath/loader/quantized.py), before any weight is loaded.

A `LinearMethod` owns its layer's parameters. A quantized one creates them in the checkpoint's
layout, so that the checkpoint's tensors, fused qkv / gate_up included, load by plain slicing
(`output_shard`), and converts them after loading (`process_weights_after_loading`) into the
layout its kernels read (see hotpath/ops/quant/reference.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear
    from hotpath.ops.linear.reference import RmsInput


def checkpoint_param(
    data: torch.Tensor,
    output_dim: int | None = 0,
    pack_factor: int = 1,
    from_checkpoint: bool = True,
    input_dim: int | None = None,
    input_pack: int = 1,
) -> nn.Parameter:
    """A parameter in a checkpoint layout: the stacked projections' outputs lie along `output_dim`,
    `pack_factor` output features to an element (8 nibbles to an int32, 128 rows to a block
    scale); `output_dim=None`: one row per projection (GPTQ's g_idx, the same for all).
    `from_checkpoint=False`: made by the method while loading, not read (online scales).

    `input_dim` / `input_pack`: where the input features lie in the *checkpoint's* tensor and how
    many to an element (None: the tensor has no input dimension), so a row-parallel Linear narrows
    it to its rank's inputs. A method that stores finer output blocks than the checkpoint (fp8
    block scales re-blocked for a rank's width) sets `checkpoint_pack` on the parameter: the
    checkpoint's output features to an element, expanded to `pack_factor` as the tensor loads.
    Linear.weight_loader is the one place that reads these (layers/linear.py)."""
    param = nn.Parameter(data, requires_grad=False)
    param.output_dim = output_dim
    param.pack_factor = pack_factor
    param.from_checkpoint = from_checkpoint
    param.input_dim = input_dim
    param.input_pack = input_pack
    return param


def output_shard(layer: Linear, param: nn.Parameter, shard: int) -> torch.Tensor:
    """The part of `param` that projection `shard` of `layer` fills (a view)."""
    output_dim = getattr(param, "output_dim", 0)
    if output_dim is None:
        return param.data[shard]
    pack = getattr(param, "pack_factor", 1)
    start = sum(layer.output_sizes[:shard])
    return param.data.narrow(output_dim, start // pack, -(-layer.output_sizes[shard] // pack))


def copy_checked(target: torch.Tensor, loaded: torch.Tensor) -> None:
    if loaded.shape != target.shape:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(target.shape)}")
    target.copy_(loaded)


class LinearMethod:
    """The arithmetic and parameters of one Linear. This base loads by plain slicing; subclasses
    create their parameters and run them."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        raise NotImplementedError

    def load_checkpoint(self, layer: Linear, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        """Takes one full checkpoint tensor: under tensor parallelism narrowed to this rank's part
        (Linear.rank_part), then `load_weight`. A method whose conversion must see the whole
        tensor (online fp8's per-row scales) converts first and narrows what it made."""
        if layer.output_ranges is not None or layer.input_range is not None:
            loaded = layer.rank_part(param, shard, loaded)
        self.load_weight(layer, param, shard, loaded)

    def load_weight(self, layer: Linear, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        """Copies one checkpoint tensor (projection `shard`'s part of `param`), this rank's part."""
        copy_checked(output_shard(layer, param, shard), loaded)

    def process_weights_after_loading(self, layer: Linear) -> None:
        """Converts the loaded checkpoint layout into the kernels' layout (nothing by default)."""

    def fuses(self, layer: Linear, x: torch.Tensor) -> bool:
        raise NotImplementedError

    def apply(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None,
              out_dtype: torch.dtype | None) -> torch.Tensor:
        raise NotImplementedError

    def apply_silu_and_mul(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None) -> torch.Tensor:
        raise NotImplementedError

    def apply_add_residual(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class QuantConfig:
    """A quantization format: the method its linear layers take, which layers it leaves in the
    model dtype, and which checkpoint tensors its MoE experts have (layers/quant/experts.py loads
    them in the fused MoE kernels' layout)."""

    name: str  # the quant_method / --quantization value
    # suffixes of one expert projection's checkpoint tensors (("weight", "weight_scale_inv"));
    # empty: the experts are not quantized in this format and load as they are
    expert_tensors: tuple[str, ...] = ()

    def linear_method(self) -> LinearMethod:
        raise NotImplementedError

    def skips(self, module_name: str, shard_names: list[str]) -> bool:
        """Whether the layer `module_name` (its checkpoint projections `shard_names`, e.g.
        model.layers.0.self_attn.q_proj) stays in the model dtype."""
        return False

    def method_for(self, module_name: str, shard_names: list[str]) -> LinearMethod | None:
        """The method layer `module_name` takes in place of the one it was born with, where the
        format decides per layer (a GGUF's per-tensor types); None: it keeps its own."""
        return None


_building: ContextVar[QuantConfig | None] = ContextVar("hotpath_quant_config", default=None)


@contextmanager
def building_with(config: QuantConfig | None) -> Iterator[None]:
    """Layers built inside take their quantization from `config` (None: unquantized)."""
    token = _building.set(config)
    try:
        yield
    finally:
        _building.reset(token)


def current_quant_config() -> QuantConfig | None:
    return _building.get()
