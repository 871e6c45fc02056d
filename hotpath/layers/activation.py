"""The gated MLP: down(silu(gate(x)) * up(x)) with gate and up in one matmul."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear
from hotpath.ops.linear import fused_mlp_fits, linear_silu_and_mul


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = Linear(intermediate_size, [hidden_size])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate_up and SiLU-and-mul fused where the GEMV runs (decode), two ops elsewhere
        return self.down_proj(linear_silu_and_mul(x, self.gate_up_proj.weight))

    def transpose_down(self) -> None:
        """Stores down_proj's weight transposed ([I, H] contiguous; the parameter is its [H, I]
        view, which matmuls take as it is) where decode steps run the whole MLP as one kernel
        (ops/linear's gated_mlp_accumulate), whose programs each read rows of it."""
        w = self.down_proj.weight
        if not self.down_transposed and fused_mlp_fits(self.gate_up_proj.weight, w):
            w.data = w.data.t().contiguous().t()

    @property
    def down_transposed(self) -> bool:
        return self.down_proj.weight.stride() == (1, self.down_proj.weight.shape[0])

    @property
    def down_t(self) -> torch.Tensor:  # [I, H]
        return self.down_proj.weight.t()
