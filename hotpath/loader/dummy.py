"""Random weights at the config's real shapes (`load_format="dummy"`), for speed measurements:
decode time does not depend on weight values."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        # generate on the CPU in fp32 so every device and dtype sees the same values
        values = torch.randn(param.shape, generator=gen) * std
        if name.endswith("norm.weight"):
            values += 1.0  # RMSNorm gains near 1, as in trained models
        param.data.copy_(values)
