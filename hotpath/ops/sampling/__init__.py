"""Greedy sampling (argmax and its logprob per row): the reference on the CPU, Triton on the GPU
(see hotpath/ops/backend.py). The decode CUDA graphs capture it after the LM head, so a greedy
step needs no sampler launches of its own."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.sampling import reference


def greedy_sample(
    logits: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    host_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if backend.use_triton(logits):
        from hotpath.ops.sampling import triton as kernels

        return kernels.greedy_sample(logits, out, host_out)
    return reference.greedy_sample(logits, out, host_out)


__all__ = ["greedy_sample"]
