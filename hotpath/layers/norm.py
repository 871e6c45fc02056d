"""RMSNorm layer; passing `residual` selects the fused residual-add path."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.layers.linear import WeightLoaders
from hotpath.ops.norm import fused_add_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """x / rms(x) * weight. `zero_centred`: the checkpoint stores weight - 1 (Qwen3-Next and
    Qwen3.5 normalise with (1 + w)); the loader adds the 1, so the kernels see a plain weight."""

    def __init__(self, hidden_size: int, eps: float, zero_centred: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centred = zero_centred
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        return {f"{prefix}.weight": self._load}

    def _load(self, loaded: torch.Tensor) -> None:
        if loaded.shape != self.weight.shape:
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(self.weight.shape)}")
        self.weight.data.copy_(loaded.float() + 1 if self.zero_centred else loaded)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return fused_add_rms_norm(x, residual, self.weight, self.eps)
