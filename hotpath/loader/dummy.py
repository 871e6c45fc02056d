"""Random weights at the config's real shapes (`load_format="dummy"`), for speed measurements:
decode time does not depend on weight values."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    # generated on the parameter's own device: an 8B model initialises in well under a second on
    # a GPU, where host-side generation would take a minute
    for i, (name, param) in enumerate(model.named_parameters()):
        gen = torch.Generator(device=param.device).manual_seed(seed + i)
        param.normal_(mean=1.0 if name.endswith("norm.weight") else 0.0, std=std, generator=gen)
