"""Linear layers: the seam for quantization (and, later, tensor parallelism).

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn as nn

from hotpath.layers.quant.base import LinearMethod, current_quant_config
from hotpath.ops.linear import linear, linear_add_residual, linear_silu_and_mul, use_gemv
from hotpath.ops.linear.reference import RmsInput

# checkpoint tensor name -> what copies that tensor into the model's parameters
WeightLoaders = dict[str, Callable[[torch.Tensor], None]]


class UnquantizedLinearMethod(LinearMethod):
    """Weights in the model dtype, [out_features, in_features]; hotpath.ops.linear runs them."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)

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
    "v_proj"] for a qkv_proj); without it the checkpoint's tensor has the module's own name."""

    def __init__(
        self,
        in_features: int,
        output_sizes: Sequence[int],
        bias: bool = False,
        checkpoint_names: Sequence[str] | None = None,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        if checkpoint_names is not None and len(checkpoint_names) != len(output_sizes):
            raise ValueError("checkpoint_names must name every stacked projection")
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        self.checkpoint_names = None if checkpoint_names is None else list(checkpoint_names)
        if method is None:
            quant = current_quant_config()
            method = UnquantizedLinearMethod() if quant is None else quant.linear_method()
        self.method = method
        self.method.create_weights(self, in_features, sum(output_sizes))
        self.bias = nn.Parameter(torch.empty(sum(output_sizes)), requires_grad=False) if bias else None

    def set_method(self, method: LinearMethod) -> None:
        """Replaces the method and its (not yet loaded) parameters: for layers a quantized
        format leaves in the model dtype, found by name after the model is built."""
        for name, _ in list(self.named_parameters(recurse=False)):
            if name != "bias":
                delattr(self, name)
        self.method = method
        method.create_weights(self, self.in_features, sum(self.output_sizes))

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
        return loaders

    def weight_loader(self, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        """Copies one checkpoint tensor (e.g. k_proj.weight, shard 1) into its part of `param`
        (its rows; for a quantized method, what its layout says)."""
        self.method.load_weight(self, param, shard, loaded)

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
