"""The gated MLP: down(silu(gate(x)) * up(x)) with gate and up in one projection.

Under tensor parallelism gate_up is column-parallel (each rank its slice of the intermediate
features, of gate and of up alike, so SiLU-and-mul stays local) and down_proj row-parallel:
`forward` returns this rank's partial sum, which the decoder layer reduces."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear
from hotpath.layers.norm import RMSNorm


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, [intermediate_size, intermediate_size],
                                   checkpoint_names=["gate_proj", "up_proj"], parallel="column")
        self.down_proj = Linear(intermediate_size, [hidden_size], parallel="row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # gate_up and SiLU-and-mul fused where the GEMV runs (decode), two ops elsewhere
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))

    def fuses(self, x: torch.Tensor) -> bool:
        return self.gate_up_proj.fuses(x) and self.down_proj.fuses(x)

    def forward_few_rows(
        self,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32, h's partial sums of squares
        norm: RMSNorm,  # the post-attention RMSNorm, applied as gate_up loads h
    ) -> torch.Tensor:  # [T', M] fp32, the new h's
        """h += mlp(norm(h)): two projection launches, SiLU-and-mul in the first."""
        y = self.gate_up_proj.silu_and_mul(h, rms=(sumsq, norm.weight, norm.eps))
        return self.down_proj.add_residual(y, h)
