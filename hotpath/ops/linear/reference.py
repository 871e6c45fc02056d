"""Linear projection: out = x @ weight^T (+ bias), as torch computes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(
    x: torch.Tensor,  # [..., in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [..., out_features]
    return F.linear(x, weight, bias)
