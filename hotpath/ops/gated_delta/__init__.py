"""Gated DeltaNet: the gated delta rule and the causal conv1d before it. reference.py is the torch
definition; the decode step (one token per sequence) has Triton kernels (triton_decode.py), run on
the GPU (checked in the interpreter and compiled for sm90 and gfx942/950; not yet run on a GPU);
prefill runs the reference's chunked form until its kernel comes."""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.gated_delta import reference


def decode_step(
    mixed: torch.Tensor,  # [N, conv_dim] pre-conv [q | k | v], one token per sequence
    conv_weight: torch.Tensor,  # [conv_dim, K]
    conv_states: torch.Tensor,  # [num_slots, conv_dim, K - 1], updated in place
    a: torch.Tensor,  # [N, Hv]
    b: torch.Tensor,  # [N, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [N] int64
    context_lens: torch.Tensor,  # [N] int32; 1: the sequence's first token (zero states)
    num_k_heads: int,
) -> torch.Tensor:  # [N, Hv, Dv] in mixed's dtype
    """See reference.decode_step; on the GPU two launches, no host sync."""
    if backend.use_triton(mixed):
        from hotpath.ops.gated_delta import triton_decode

        return triton_decode.decode_step(mixed, conv_weight, conv_states, a, b, A_log, dt_bias, states,
                                         slots, context_lens, num_k_heads)
    return reference.decode_step(mixed, conv_weight, conv_states, a, b, A_log, dt_bias, states, slots,
                                 context_lens, num_k_heads)


__all__ = ["decode_step"]
