"""Build a model directly on its device and dtype (quantized layers in their format's parameters),
then fill its weights."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.loader.dummy import init_dummy_weights
from hotpath.layers.quant.base import building_with
from hotpath.loader.gguf import weights_dir
from hotpath.loader.quantized import finish_loading, keep_unquantized
from hotpath.loader.safetensors import iterate_safetensors
from hotpath.models.registry import get_model_class

LOAD_FORMATS = ("auto", "safetensors", "dummy")


def load_model(
    cfg: ModelConfig,
    model_dir: Path,
    load_format: str,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    seed: int = 0,
) -> nn.Module:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")
    model_cls = get_model_class(cfg.architecture)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # parameters are born on the target device, in their final format: no host copy
        with torch.device(device), building_with(cfg.quantization):
            model = model_cls(cfg, max_positions)
            if cfg.quantization is not None:
                keep_unquantized(model, cfg.quantization)
    finally:
        torch.set_default_dtype(old_dtype)
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        model.load_weights(iterate_safetensors(weights_dir(model_dir, dtype)))
    finish_loading(model)
    return model.eval()
