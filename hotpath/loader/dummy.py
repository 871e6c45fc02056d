"""Random weights at the config's real shapes (`load_format="dummy"`), for speed measurements:
decode time does not depend on weight values. Quantized layers get random values in their
checkpoint layout (then converted as a loaded checkpoint is): fp8 weights, positive scales, int4
words, and GPTQ's g_idx in plain group order; int4 MoE experts, which hold the kernels' layout
already, zero points 0..15 (uint8); a GGUF kept quantized, random codes and scales.

Each parameter's values come from a generator seeded by its name, at the one-rank model's shape:
under tensor parallelism (`unsharded`: the same model built for one rank, on the meta device, for
its shapes) every full tensor is generated so and narrowed to the rank's part by its layer's own
loaders (`load_unsharded`), so a dummy model computes the same function at every tp size."""

from __future__ import annotations

import zlib

import torch
import torch.nn as nn


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02,
                       unsharded: nn.Module | None = None) -> None:
    full_params = dict((unsharded or model).named_parameters())
    for name, param in model.named_parameters():
        full = full_params[name]
        value = _random_value(unsharded or model, name, full.shape, param.dtype, param.device,
                              seed, std)
        module_name, _, param_name = name.rpartition(".")
        module = model.get_submodule(module_name)
        if unsharded is not None and hasattr(module, "load_unsharded"):
            module.load_unsharded(param_name, value)
        elif full.shape == param.shape:  # one rank, or a layer every rank holds whole
            param.copy_(value)
        else:
            raise ValueError(f"dummy weights under tensor parallelism: {type(module).__name__} "
                             f"{module_name!r} holds a part of {name} but cannot take it from the "
                             "full tensor (it has no load_unsharded)")


def _random_value(model: nn.Module, name: str, shape: torch.Size, dtype: torch.dtype,
                  device: torch.device, seed: int, std: float) -> torch.Tensor:
    # generated on the parameter's own device: an 8B model initialises in well under a second on
    # a GPU, where host-side generation would take a minute
    gen = torch.Generator(device=device).manual_seed(seed + zlib.crc32(name.encode()))
    value = torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point and value.element_size() > 1:
        value.normal_(mean=1.0 if name.endswith("norm.weight") else 0.0, std=std, generator=gen)
        if name.endswith(("scale", "scales", "scale_inv")):
            value.abs_()
    elif dtype.is_floating_point:  # fp8 weights, of unit size (their scales carry std)
        value.copy_(torch.randn(shape, generator=gen, device=device))
    elif dtype == torch.uint8:  # int4 experts' zero points; GGUF nibbles and scales
        value.random_(0, 16, generator=gen)
    elif dtype == torch.int8:  # GGUF 8-bit codes
        value.random_(-128, 128, generator=gen)
    elif name.endswith("g_idx"):  # [projections, K]
        groups = model.get_submodule(name.rpartition(".")[0]).scales.shape[0]
        K = shape[-1]
        value.copy_(torch.arange(K, device=device) // (K // groups))
    else:  # packed int4 words
        value.random_(-2**31, 2**31 - 1, generator=gen)
    return value
