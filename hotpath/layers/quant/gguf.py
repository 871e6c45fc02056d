"""GGUF weights kept quantized: every Linear whose checkpoint tensors a GGUF stores in a supported
quantized type (hotpath.ops.gguf.FORMATS) holds them in the GGUF layout of hotpath/ops/gguf
(repacked once as they load, no 16-bit copy), and so do the LM head (the GGUF kernel) and the
embedding (its looked-up rows dequantized; a tied head runs on the embedding's matrix); the rest
(F32 / F16 tensors, types without a kernel) load dequantized in the model dtype, as from the
converted copy.

A GGUF picks each tensor's type, so the projections of one fused layer may differ (Qwen2.5's
attn_v in Q8_0 beside attn_q / attn_k in Q5_0): such a layer keeps one weight per run of equal
types and runs one kernel per run. The layer types are known from the GGUF's header before any
data is read: `GGUFQuantConfig.method_for` gives each Linear its method by module name after the
model is built (loader/quantized.py), and `keeps_quantized` tells the weight reader
(loader/gguf.py iterate_gguf) which tensors to hand over as their raw blocks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from hotpath.layers.quant.base import LinearMethod, QuantConfig, checkpoint_param, copy_checked
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.gguf import (
    FORMATS_BY_ID,
    GGUFFormat,
    GGUFWeight,
    empty_weight,
    gguf_fuses,
    gguf_linear,
    gguf_linear_add_residual,
    gguf_linear_silu_and_mul,
    repack,
)
from hotpath.ops.gguf.reference import dequantize_rows
from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.norm import rms_norm

if TYPE_CHECKING:
    from hotpath.layers.linear import Linear
    from hotpath.ops.linear.reference import RmsInput

_LAYOUT = ("codes", "high", "d", "dm", "sc", "mc")


class _Run:
    """Consecutive projections of one type: one weight, one kernel."""

    def __init__(self, fmt: GGUFFormat, shards: list[int], row_starts: list[int], rows: int) -> None:
        self.fmt, self.shards, self.row_starts, self.rows = fmt, shards, row_starts, rows
        self.weight: GGUFWeight | None = None


class GGUFLinearMethod(LinearMethod):
    """One Linear's projections in their GGUF types (`formats`, one per stacked projection)."""

    def __init__(self, formats: list[GGUFFormat]) -> None:
        self.formats = formats
        self.runs: list[_Run] = []

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        if layer.output_ranges is not None or layer.input_range is not None:
            raise ValueError("GGUF weights kept quantized do not split over tensor-parallel ranks; "
                             "load the GGUF with tensor_parallel_size=1")
        assert len(self.formats) == len(layer.output_sizes)
        self.runs = []
        for shard, (fmt, size) in enumerate(zip(self.formats, layer.output_sizes)):
            if self.runs and self.runs[-1].fmt is fmt:
                run = self.runs[-1]
                run.shards.append(shard)
                run.row_starts.append(run.rows)
                run.rows += size
            else:
                self.runs.append(_Run(fmt, [shard], [0], size))
        for i, run in enumerate(self.runs):
            for name, t in empty_weight(run.fmt, run.rows, in_features).tensors().items():
                setattr(layer, f"gguf{i}_{name}", checkpoint_param(t, from_checkpoint=False))
        # the loaders' handle: each projection's GGUF blocks as stored, uint8 [rows, row bytes]
        layer.weight = checkpoint_param(torch.empty(0, dtype=torch.uint8), output_dim=None)

    def load_weight(self, layer: Linear, param: nn.Parameter, shard: int, loaded: torch.Tensor) -> None:
        if param is not layer.weight:  # the bias
            super().load_weight(layer, param, shard, loaded)
            return
        fmt, K = self.formats[shard], layer.in_features
        rows = layer.output_sizes[shard]
        if loaded.dtype != torch.uint8 or loaded.shape != (rows, K // fmt.block * fmt.block_bytes):
            raise ValueError(f"is not {fmt.name} blocks of a [{rows}, {K}] weight (got "
                             f"{loaded.dtype} {tuple(loaded.shape)})")
        i = next(i for i, run in enumerate(self.runs) if shard in run.shards)
        run = self.runs[i]
        start = run.row_starts[run.shards.index(shard)]
        w = repack(fmt, loaded.to(getattr(layer, f"gguf{i}_codes").device), K)
        for name, t in w.tensors().items():
            copy_checked(getattr(layer, f"gguf{i}_{name}").data[start:start + rows], t)

    def process_weights_after_loading(self, layer: Linear) -> None:
        for i, run in enumerate(self.runs):
            run.weight = GGUFWeight(run.fmt, *(getattr(layer, f"gguf{i}_{name}") for name in _LAYOUT))

    def _bias(self, layer: Linear, run: _Run) -> torch.Tensor | None:
        if layer.bias is None or len(self.runs) == 1:
            return layer.bias
        first = sum(layer.output_sizes[:run.shards[0]])
        return layer.bias[first:first + run.rows]

    def fuses(self, layer: Linear, x: torch.Tensor) -> bool:
        return gguf_fuses(x)

    def apply(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None,
              out_dtype: torch.dtype | None) -> torch.Tensor:
        if len(self.runs) == 1:
            return gguf_linear(x, self.runs[0].weight, layer.bias, rms=rms, out_dtype=out_dtype)
        if rms is not None:  # normalised once for every run
            x = rms_norm(x, rms[1], rms[2])
        return torch.cat([gguf_linear(x, run.weight, self._bias(layer, run), out_dtype=out_dtype)
                          for run in self.runs], dim=-1)

    def embed(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:  # [T, K]
        """An embedding's lookup: the rows dequantized, in the model dtype (rounded as the 16-bit
        copy rounds them)."""
        assert len(self.runs) == 1
        return dequantize_rows(self.runs[0].weight, input_ids).to(layer.dtype)

    def apply_silu_and_mul(self, layer: Linear, x: torch.Tensor, rms: RmsInput | None) -> torch.Tensor:
        assert layer.bias is None, "the fused gate_up projections have no bias"
        if len(self.runs) == 1:
            return gguf_linear_silu_and_mul(x, self.runs[0].weight, rms=rms)
        return silu_and_mul(self.apply(layer, x, rms, None))

    def apply_add_residual(self, layer: Linear, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        assert layer.bias is None, "the fused output projections have no bias"
        if len(self.runs) == 1:
            return gguf_linear_add_residual(x, self.runs[0].weight, residual)
        return linear_ref.add_residual(self.apply(layer, x, None, None), residual)


class _PendingMethod(LinearMethod):
    """What a Linear is born with under a GGUF: no parameters, until `method_for` names its
    method (the types are per tensor, known by name only after the model is built)."""

    def create_weights(self, layer: Linear, in_features: int, out_features: int) -> None:
        pass


class GGUFQuantConfig(QuantConfig):
    """A GGUF's tensor types (HF names -> gguf type ids) and which Linear weights stay quantized."""

    name = "gguf"

    def __init__(self, path: Path, types: dict[str, int]) -> None:
        self.path = path
        self.types = types
        self.kept: set[str] = set()  # HF weight names handed over as their blocks

    @classmethod
    def from_file(cls, path: Path) -> GGUFQuantConfig:
        from hotpath.loader.gguf import hf_tensor_name, open_gguf

        types = {}
        for t in open_gguf(path).tensors:
            name = hf_tensor_name(t.name)
            if name is not None:
                types[name] = int(t.qtype)
        return cls(Path(path), types)

    def linear_method(self) -> LinearMethod:
        return _PendingMethod()

    def method_for(self, module_name: str, shard_names: list[str]) -> LinearMethod:
        from hotpath.layers.linear import UnquantizedLinearMethod

        weights = [f"{s}.weight" for s in shard_names]
        formats = [FORMATS_BY_ID.get(self.types.get(w, -1)) for w in weights]
        if any(f is None for f in formats):  # a float or kernel-less projection: all dequantized
            return UnquantizedLinearMethod()
        self.kept.update(weights)
        return GGUFLinearMethod(formats)

    def keeps_quantized(self, hf_name: str) -> bool:
        return hf_name in self.kept
