"""The Gated DeltaNet's causal depthwise conv1d for a prefill step in Triton: the tokens of several
sequences one after another, each continuing from (and leaving) its slot's conv state, with no
host sync. Two launches:

1. `_conv_kernel`, a program per (chunk of BLOCK_T tokens of one sequence, block of channels),
   chunks from the gated delta rule's chunk table (triton_chunked.chunk_table): each output is
   silu(sum_j w[c, j] * x_in[t - K + 1 + j]), where inputs before the sequence's first token come
   from its slot's conv state (the K - 1 inputs before it; zeros for a sequence's first step: the
   caller zeroes fresh slots);
2. `_conv_state_kernel`, a program per (sequence, block of channels), after every program of the
   first has read the states: the slot's state := the last K - 1 inputs (its old state shifted
   along for a sequence shorter than K - 1 tokens; untouched for an empty one).

They round as reference.causal_conv1d does (torch's conv1d in the weight's dtype, then SiLU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait


@triton.jit
def _conv_kernel(
    x_ptr,  # [T, C], rows stride_xt apart
    w_ptr,  # [C, K]
    conv_ptr,  # [num_slots, C, K - 1], read only
    cu_ptr,  # [N + 1] int32
    slots_ptr,  # [N] int64
    chunk_seq_ptr,  # [max_chunks] int32
    cu_chunks_ptr,  # [N + 1] int32
    y_ptr,  # [T, C]
    N,
    C,
    stride_xt,
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    j = tl.program_id(0)
    seq = tl.load(chunk_seq_ptr + j)
    if seq >= N:  # past the real chunks
        return
    start = tl.load(cu_ptr + seq)
    end = tl.load(cu_ptr + seq + 1)
    first = start + (j - tl.load(cu_chunks_ptr + seq)) * BLOCK_T
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    rt = first + tl.arange(0, BLOCK_T)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = rc < C
    t_ok = rt < end
    pdl_wait(USE_PDL)
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for tap in tl.static_range(K):
        u = rt - (K - 1) + tap  # the input this tap reads
        from_x = t_ok[:, None] & (u >= start)[:, None] & c_ok[None, :]
        val = tl.load(x_ptr + u.to(tl.int64)[:, None] * stride_xt + rc[None, :], mask=from_x, other=0.0)
        # before the sequence: state column K - 1 + (u - start)
        from_state = t_ok[:, None] & (u < start)[:, None] & c_ok[None, :]
        col = (K - 1) + (u - start)
        old = tl.load(conv_ptr + (slot * C + rc[None, :]) * (K - 1) + col[:, None], mask=from_state, other=0.0)
        w = tl.load(w_ptr + rc * K + tap, mask=c_ok, other=0.0).to(tl.float32)
        acc += (val.to(tl.float32) + old.to(tl.float32)) * w[None, :]
    acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)  # conv1d's output dtype, then SiLU
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + rt.to(tl.int64)[:, None] * C + rc[None, :], y.to(y_ptr.dtype.element_ty),
             mask=t_ok[:, None] & c_ok[None, :])


@triton.jit
def _conv_state_kernel(
    x_ptr,  # [T, C], rows stride_xt apart
    conv_ptr,  # [num_slots, C, K - 1], updated in place
    cu_ptr,  # [N + 1] int32
    slots_ptr,  # [N] int64
    C,
    stride_xt,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    seq = tl.program_id(0)
    start = tl.load(cu_ptr + seq)
    end = tl.load(cu_ptr + seq + 1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ri = tl.arange(0, BLOCK_K)  # the new state's columns
    c_ok = rc < C
    u = end - (K - 1) + ri  # the input each column holds
    in_state = (ri < K - 1)[None, :] & c_ok[:, None]
    pdl_wait(USE_PDL)  # every program of the conv has read the old states
    val = tl.load(x_ptr + u.to(tl.int64)[None, :] * stride_xt + rc[:, None],
                  mask=in_state & (u >= start)[None, :], other=0.0)
    old = tl.load(conv_ptr + (slot * C + rc[:, None]) * (K - 1) + ((K - 1) + (u - start))[None, :],
                  mask=in_state & (u < start)[None, :], other=0.0)
    new = tl.where((u >= start)[None, :], val.to(conv_ptr.dtype.element_ty), old)
    tl.debug_barrier()  # every column read before any is written (a short sequence shifts them)
    tl.store(conv_ptr + (slot * C + rc[:, None]) * (K - 1) + ri[None, :], new, mask=in_state)


def causal_conv1d_varlen(
    x: torch.Tensor,  # [T, C], the step's inputs (rows may be strided)
    weight: torch.Tensor,  # [C, K]
    conv_states: torch.Tensor,  # [num_slots, C, K - 1], updated in place
    cu_seqlens: torch.Tensor,  # [N + 1] int32 on the device, ending at T
    slots: torch.Tensor,  # [N] int64 on the device
    chunks: tuple[torch.Tensor, torch.Tensor],  # triton_chunked.chunk_table(cu_seqlens, T, 64)
) -> torch.Tensor:  # [T, C] in x's dtype
    T, C = x.shape
    K = weight.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    N = slots.shape[0]
    if T == 0 or N == 0:
        return y
    chunk_seq, _ = chunks
    block_t = 64  # the chunk table's chunk size
    assert chunk_seq.shape[0] == T // block_t + N, "a chunk table of 64-token chunks over these sequences"
    use_pdl = pdl_enabled(x.device)
    pdl = dict(USE_PDL=use_pdl, **pdl_launch(use_pdl))
    block_c = 64
    _conv_kernel[(chunk_seq.shape[0], triton.cdiv(C, block_c))](
        x, weight.contiguous(), conv_states, cu_seqlens, slots, chunk_seq, chunks[1], y, N, C, x.stride(0),
        K=K, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=4, **pdl,
    )
    _conv_state_kernel[(N, triton.cdiv(C, 128))](
        x, conv_states, cu_seqlens, slots, C, x.stride(0), K=K, BLOCK_K=triton.next_power_of_2(K - 1),
        BLOCK_C=128, num_warps=4, **pdl,
    )
    return y
