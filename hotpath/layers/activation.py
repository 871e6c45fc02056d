"""The gated MLP: down(silu(gate(x)) * up(x)) with gate and up in one matmul."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear
from hotpath.ops.linear import silu_mul_linear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = Linear(intermediate_size, [hidden_size])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down_proj(silu(gate) * up), one kernel for a single decode row."""
        return silu_mul_linear(gate_up, self.down_proj.weight, self.down_proj.bias)
