"""Embedding lookup with the rows' sums of squares, as torch computes them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def embedding_with_sumsq(
    input_ids: torch.Tensor,  # [M] int
    weight: torch.Tensor,  # [vocab, hidden]
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, hidden], [1, M] fp32
    x = F.embedding(input_ids, weight)
    return x, x.float().pow(2).sum(-1)[None, :]
