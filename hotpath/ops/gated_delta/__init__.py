"""Gated DeltaNet: the gated delta rule and the causal conv1d before it. reference.py is the torch
definition; on the GPU the decode step (one token per sequence) runs triton_decode.py's kernels and
the prefill's delta rule triton_chunked.py's (the chunked form, varlen over sequences)."""

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


def gated_delta_rule(
    q: torch.Tensor,  # [num_tokens, Hk, Dk], the tokens of several sequences, one after another
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] fp32 log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    cu_seqlens: torch.Tensor,  # [num_seqs + 1] int32: sequence i is cu[i]:cu[i + 1] (may be empty)
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [num_seqs] int64, sequence i's state slot
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """See reference.gated_delta_rule; on the GPU one varlen launch chain for every sequence, for
    16-bit models (in fp32 the kernels' exact "bf16x6" dots gave NaN at 16-wide key heads on the
    H200, not yet understood: tests/ops/test_gated_delta_chunked.py; fp32 runs the reference)."""
    if backend.use_triton(v) and v.dtype != torch.float32:
        from hotpath.ops.gated_delta import triton_chunked

        return triton_chunked.gated_delta_rule(q, k, v, g, beta, cu_seqlens, states, slots)
    return reference.gated_delta_rule(q, k, v, g, beta, cu_seqlens.tolist(), states, slots.tolist())


__all__ = ["decode_step", "gated_delta_rule"]
