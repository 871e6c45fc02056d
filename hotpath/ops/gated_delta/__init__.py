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


def prefill_chunks(cu_seqlens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The chunk table a prefill step's conv and rule kernels share (built once per step and
    layer, on the device), or None where they run the reference."""
    if backend.use_triton(cu_seqlens):
        from hotpath.ops.gated_delta import triton_chunked

        return triton_chunked.chunk_table(cu_seqlens, num_tokens)
    return None


def causal_conv1d_varlen(
    x: torch.Tensor,  # [T, C], several sequences' inputs one after another (rows may be strided)
    weight: torch.Tensor,  # [C, K]
    conv_states: torch.Tensor,  # [num_slots, C, K - 1], updated in place
    cu_seqlens: torch.Tensor,  # [N + 1] int32 on x's device, ending at T
    slots: torch.Tensor,  # [N] int64, sequence i's slot (zeroed by the caller for a first step)
    chunks: tuple[torch.Tensor, torch.Tensor] | None = None,  # prefill_chunks(cu_seqlens, T)
) -> torch.Tensor:  # [T, C] silu(conv) in x's dtype
    """reference.causal_conv1d for each sequence from its slot's conv state, the state after its
    last input written back; on the GPU two launches, no host sync."""
    if backend.use_triton(x):
        from hotpath.ops.gated_delta import triton_chunked, triton_conv

        if chunks is None:
            chunks = triton_chunked.chunk_table(cu_seqlens, x.shape[0])
        return triton_conv.causal_conv1d_varlen(x, weight, conv_states, cu_seqlens, slots, chunks)
    cu = cu_seqlens.tolist()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for i, slot in enumerate(slots.tolist()):
        y[cu[i]:cu[i + 1]], conv_states[slot] = reference.causal_conv1d(x[cu[i]:cu[i + 1]], weight, None,
                                                                         conv_states[slot])
    return y


def gated_delta_rule(
    q: torch.Tensor,  # [num_tokens, Hk, Dk], the tokens of several sequences, one after another
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] fp32 log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    cu_seqlens: torch.Tensor,  # [num_seqs + 1] int32: sequence i is cu[i]:cu[i + 1] (may be empty)
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [num_seqs] int64, sequence i's state slot
    chunks: tuple[torch.Tensor, torch.Tensor] | None = None,  # prefill_chunks(cu_seqlens, num_tokens)
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """See reference.gated_delta_rule; on the GPU one varlen launch chain for every sequence, for
    16-bit models (fp32 runs the reference: the kernels' exact "bf16x6" dots gave NaN at 16-wide
    key heads on the GPU, not yet understood; tests/ops/test_gated_delta_chunked.py)."""
    if backend.use_triton(v) and v.dtype != torch.float32:
        from hotpath.ops.gated_delta import triton_chunked

        return triton_chunked.gated_delta_rule(q, k, v, g, beta, cu_seqlens, states, slots, chunks=chunks)
    return reference.gated_delta_rule(q, k, v, g, beta, cu_seqlens.tolist(), states, slots.tolist())


__all__ = ["causal_conv1d_varlen", "decode_step", "gated_delta_rule", "prefill_chunks"]
