"""Prefill attention over the paged KV cache: FlashAttention-style tiles with an online softmax,
for a flat varlen batch whose sequences may already hold cached tokens (chunked prefill, prefix-cache
hits): the queries of a sequence are the last query_len positions of its context_len.

One program handles BLOCK_M consecutive queries of one sequence and one q head. Keys below the
tile's first query position are visible to every row and are walked without a mask; only the last
few key tiles (the diagonal) pay for the causal mask. Programs of the same query tile for the
different heads are launched next to each other, so the heads of a GQA group find their K/V tiles
in L2; the longest tiles (last in the sequence) are launched first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.reference import kv_scales
from hotpath.ops.attention.triton_common import (
    LOG2E,
    attend_tile,
    dot_precision,
    kv_out_scale,
    next_power_of_2,
    query_for_cache,
)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cu_query_lens_ptr,
    context_lens_ptr,
    block_tables_ptr,
    out_ptr,
    scale_log2,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    v_scale,  # fp8 cache: its values' scale (unused otherwise)
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    head = tl.program_id(0)
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_query_lens_ptr + seq)
    q_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    kv_head = head // GROUP

    m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = m < q_len
    q_pos = ctx - q_len + m
    d = tl.arange(0, HEAD_DIM_PAD)
    row_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    token = (q_start + m).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=row_mask,
        other=0.0,
    )
    q = query_for_cache(q, k_cache_ptr)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_pos = ctx - q_len + m_block * BLOCK_M  # the tile's smallest query position
    unmasked_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N  # keys below are visible to all rows
    keys_end = tl.minimum(first_pos + BLOCK_M, ctx)  # one past the tile's largest query position
    for n0 in range(0, unmasked_end, BLOCK_N):
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table, n0, keys_end, kv_head,
            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2, d,
            False, BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
        )
    for n0 in range(unmasked_end, keys_end, BLOCK_N):
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table, n0, keys_end, kv_head,
            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2, d,
            True, BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
        )

    out = kv_out_scale(acc / l_i[:, None], v_scale, v_cache_ptr)  # every real row sees key 0
    tl.store(
        out_ptr + token[:, None] * stride_ot + head * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask,
    )


def default_config(head_dim_pad: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by padded head_dim: the fastest of a tile sweep
    over a long bf16 prefill (docs/decisions.md)."""
    if dtype == torch.float32:
        return 32, 32, 4, 2
    if head_dim_pad <= 64:
        return 128, 64, 8, 3
    if head_dim_pad <= 128:
        return 128, 128, 8, 3
    return 64, 32, 4, 2


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (any strides, head_dim contiguous)
    v_cache: torch.Tensor,
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    scale: float,
    max_query_len: int,
    max_context_len: int,
    *,
    k_scale: float = 1.0,  # fp8 cache: k = k_cache * k_scale (ignored for other caches)
    v_scale: float = 1.0,
    config: tuple[int, int, int, int] | None = None,  # tuning: (BLOCK_M, BLOCK_N, warps, stages)
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Same contract as reference.paged_attention."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = context_lens.shape[0]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert num_heads % num_kv_heads == 0
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    head_dim_pad = max(16, next_power_of_2(head_dim))
    block_m, block_n, num_warps, num_stages = config or default_config(head_dim_pad, q.dtype)
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    grid = (num_heads, triton.cdiv(max_query_len, block_m), num_seqs)
    _prefill_kernel[grid](
        q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, out,
        scale * LOG2E * k_scale, v_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
