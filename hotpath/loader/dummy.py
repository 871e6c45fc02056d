"""Random weights at the config's real shapes (`load_format="dummy"`), for speed measurements:
decode time does not depend on weight values. Quantized layers get random values in their
checkpoint layout (then converted as a loaded checkpoint is): fp8 weights, positive scales, int4
words, and GPTQ's g_idx in plain group order; int4 MoE experts, which hold the kernels' layout
already, zero points 0..15 (uint8)."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    # generated on the parameter's own device: an 8B model initialises in well under a second on
    # a GPU, where host-side generation would take a minute
    for i, (name, param) in enumerate(model.named_parameters()):
        gen = torch.Generator(device=param.device).manual_seed(seed + i)
        if param.dtype.is_floating_point and param.element_size() > 1:
            param.normal_(mean=1.0 if name.endswith("norm.weight") else 0.0, std=std, generator=gen)
            if name.endswith(("scale", "scales", "scale_inv")):
                param.abs_()
        elif param.dtype.is_floating_point:  # fp8 weights, of unit size (their scales carry std)
            param.copy_(torch.randn(param.shape, generator=gen, device=param.device))
        elif param.dtype == torch.uint8:  # int4 experts' zero points
            param.random_(0, 16, generator=gen)
        elif name.endswith("g_idx"):  # [projections, K]
            groups = model.get_submodule(name.rpartition(".")[0]).scales.shape[0]
            K = param.shape[-1]
            param.copy_(torch.arange(K, device=param.device) // (K // groups))
        else:  # packed int4 words
            param.random_(-2**31, 2**31 - 1, generator=gen)
