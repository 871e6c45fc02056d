"""Linear layers.

`Linear` can hold several logical projections stacked along the output dimension (q/k/v, gate/up),
so one matmul reads their weights; the loader fills each shard from its own checkpoint tensor.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.ops.linear import linear


class Linear(nn.Module):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        out_features = sum(output_sizes)
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        )

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: int = 0) -> None:
        """Copy one checkpoint tensor (e.g. k_proj.weight, shard 1) into its rows."""
        param = getattr(self, param_name)
        start = sum(self.output_sizes[:shard])
        rows = self.output_sizes[shard]
        target = param.data[start : start + rows]
        if loaded.shape != target.shape:
            raise ValueError(
                f"checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
