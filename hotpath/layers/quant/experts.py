"""Quantized MoE experts, dequantized as they load: the fused MoE kernels (hotpath/ops/moe) take
experts in the model dtype, so a quantized checkpoint's expert projections (Qwen3-30B-A3B-FP8:
`experts.{e}.gate_proj.weight` fp8 + `.weight_scale_inv`) are collected tensor by tensor and
each projection, once all its tensors have arrived, is dequantized on the device into its slice
of the stacked weights. The host holds at most a few of one projection's tensors at a time."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from hotpath.layers.quant.base import QuantConfig

Loader = Callable[[torch.Tensor], None]


def dequantizing_loaders(config: QuantConfig, dense: dict[str, Loader], dtype: torch.dtype,
                         device: torch.device) -> dict[str, Loader]:
    """`dense` maps each expert projection's `{...}.weight` to the loader of its dense [N, K]
    tensor; returns the loaders of the checkpoint's tensors for them (`{...}.{suffix}` for each
    of the format's expert_tensors)."""
    loaders: dict[str, Loader] = {}
    for name, load_dense in dense.items():
        base = name.removesuffix(".weight")
        pending: dict[str, torch.Tensor] = {}
        for suffix in config.expert_tensors:
            loaders[f"{base}.{suffix}"] = partial(_collect, config, pending, suffix, load_dense, dtype,
                                                  device)
    return loaders


def _collect(config: QuantConfig, pending: dict[str, torch.Tensor], suffix: str, load_dense: Loader,
             dtype: torch.dtype, device: torch.device, tensor: torch.Tensor) -> None:
    pending[suffix] = tensor.to(device)
    if len(pending) == len(config.expert_tensors):
        weight = config.dequantize_expert(dict(pending), dtype)
        pending.clear()
        load_dense(weight)
