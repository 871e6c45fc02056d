"""Build a model directly on its device and dtype (quantized layers in their format's parameters),
then fill its weights; and, for speculative decoding with method "mtp", the multi-token-prediction
head a Qwen3-Next / Qwen3.5 checkpoint carries beside its model (`load_mtp`).

Under tensor parallelism (called inside `building_parallel`) the model is this rank's shard: each
rank streams every full checkpoint tensor and its layers narrow it to their part as it loads
(layers/linear.py). Reading only the rank's slice out of the safetensors files would cut each
rank's reads by tp; that is a later optimisation. Dummy weights are generated at the one-rank
model's shapes and narrowed the same way (loader/dummy.py)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.distributed.parallel_state import SINGLE, building_parallel, current_parallel
from hotpath.layers.linear import Linear, UnquantizedLinearMethod
from hotpath.layers.moe import FusedExperts
from hotpath.layers.quant.base import building_with
from hotpath.layers.quant.gguf import GGUFQuantConfig
from hotpath.loader.dummy import init_dummy_weights
from hotpath.loader.gguf import iterate_gguf, weights_dir
from hotpath.loader.quantized import finish_loading, set_layer_methods
from hotpath.loader.safetensors import checkpoint_tensor_names, iterate_safetensors
from hotpath.models.decoder import CausalLM
from hotpath.models.mtp import MTP_PREFIX, MtpHead, supports_mtp
from hotpath.models.registry import get_model_class

LOAD_FORMATS = ("auto", "safetensors", "dummy")


@contextmanager
def _building(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Parameters built inside are born on `device` in `dtype`, in their final format: no host copy."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), building_with(cfg.quantization):
            yield
    finally:
        torch.set_default_dtype(old_dtype)


def _check_load_format(load_format: str) -> None:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose one of {LOAD_FORMATS}")


def load_model(
    cfg: ModelConfig,
    model_dir: Path,
    load_format: str,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    seed: int = 0,
) -> nn.Module:
    _check_load_format(load_format)
    model_cls = get_model_class(cfg.architecture)
    with _building(cfg, device, dtype):
        model = model_cls(cfg, max_positions)
        if cfg.quantization is not None:
            set_layer_methods(model, cfg.quantization)
    if load_format == "dummy":
        init_dummy_weights(model, seed, unsharded=_unsharded_shapes(cfg, dtype, max_positions))
    elif isinstance(cfg.quantization, GGUFQuantConfig):
        model.load_weights(iterate_gguf(model_dir, cfg.quantization.keeps_quantized))
    else:
        model.load_weights(iterate_safetensors(weights_dir(model_dir, dtype)))
    finish_loading(model)
    return model.eval()


def _unsharded_shapes(cfg: ModelConfig, dtype: torch.dtype, max_positions: int) -> nn.Module | None:
    """Under tensor parallelism, the same model built for one rank on the meta device (no memory):
    the full shapes its dummy weights are generated at. None on one rank."""
    if current_parallel().tp.size == 1:
        return None
    with building_parallel(SINGLE), _building(cfg, torch.device("meta"), dtype):
        model = get_model_class(cfg.architecture)(cfg, max_positions)
        if cfg.quantization is not None:
            set_layer_methods(model, cfg.quantization)
    return model


def load_mtp(
    cfg: ModelConfig,
    model_dir: Path,
    load_format: str,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    seed: int,
    target: CausalLM,
) -> MtpHead:
    """The checkpoint's multi-token-prediction head (its `mtp.*` tensors; hotpath/models/mtp.py)
    on `target`'s embedding and LM head, built and loaded as `load_model` builds the target
    (`load_format="dummy"`: random weights, one MTP layer unless config.json says how many).

    Raises ValueError when the model has none: a family without one, a config that declares 0
    MTP layers, or a checkpoint without `mtp.*` tensors."""
    _check_load_format(load_format)
    if not supports_mtp(target):
        raise ValueError(f"{cfg.architecture} has no multi-token-prediction head (mtp.*): MTP "
                         "drafting needs a Qwen3-Next or Qwen3.5 checkpoint")
    names: list[str] = []
    if load_format != "dummy":
        names = [n for n in checkpoint_tensor_names(weights_dir(model_dir, dtype)) if n.startswith(MTP_PREFIX)]
        if not names:
            raise ValueError(f"the checkpoint in {model_dir} has no multi-token-prediction head "
                             "(mtp.* weights)")
    num_layers = cfg.mtp_num_layers
    if num_layers is None:  # config.json does not say: the checkpoint's mtp.layers.{i}, or one
        found = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
        num_layers = max(found) + 1 if found else 1
    if num_layers < 1:
        raise ValueError(f"{model_dir} has no multi-token-prediction head (mtp.*): its config.json "
                         f"declares {num_layers} MTP layers")
    # a copy of the format: set_layer_methods renames its ignore list to this module's names
    quant = copy.deepcopy(cfg.quantization)
    mtp_cfg = copy.copy(cfg)
    mtp_cfg.quantization = quant
    with _building(mtp_cfg, device, dtype):
        mtp = MtpHead(mtp_cfg, num_layers, target, max_positions)
        if quant is not None:
            set_layer_methods(mtp, quant)
            if names:
                _take_stored_formats(mtp, set(names))
    if load_format == "dummy":
        init_dummy_weights(mtp, seed)
    else:
        mtp.load_weights(iterate_safetensors(weights_dir(model_dir, dtype), desc="Loading MTP weights",
                                             select=lambda n: n.startswith(MTP_PREFIX)))
    finish_loading(mtp)
    return mtp.eval()


def _take_stored_formats(mtp: MtpHead, names: set[str]) -> None:
    """Quantized layers of the head whose checkpoint tensors are not all there in the format
    (a quantizer that left the MTP head in 16 bits) take the model dtype, before any loading;
    if their 16-bit tensors are missing too, loading says so."""
    def stored(module: nn.Module, prefix: str) -> bool:
        return all(MTP_PREFIX + n in names for n in module.checkpoint_tensors(prefix))

    for prefix, module in mtp.named_modules():
        if isinstance(module, Linear) and not isinstance(module.method, UnquantizedLinearMethod):
            if not stored(module, prefix):
                module.set_method(UnquantizedLinearMethod())
        elif isinstance(module, FusedExperts) and module.checkpoint_quant is not None and not stored(module, prefix):
            module.checkpoint_quant = None
