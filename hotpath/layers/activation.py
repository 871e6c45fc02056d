"""The gated MLP: down(silu(gate(x)) * up(x)) with gate and up in one matmul."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear
from hotpath.ops.linear import linear_silu_and_mul


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = Linear(intermediate_size, [hidden_size])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate_up and SiLU-and-mul fused where the GEMV runs (decode), two ops elsewhere
        return self.down_proj(linear_silu_and_mul(x, self.gate_up_proj.weight))
