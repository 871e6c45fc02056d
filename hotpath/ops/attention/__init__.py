"""Attention over the paged KV cache.

`paged_attention` runs the readable reference on the CPU and a Triton kernel on the GPU (see
hotpath/ops/backend.py): the flash-decoding kernel when every sequence brings few queries (decode,
speculative verify), the FlashAttention-style prefill kernel otherwise.
"""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.attention import reference

# Up to this many queries per sequence, the decode kernel (all query tokens and GQA heads of a
# sequence in one tile, context split across programs) beats the prefill kernel.
DECODE_MAX_QUERY_LEN = 8


def write_kv_cache(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    if backend.use_triton(k):
        from hotpath.ops.attention import triton_cache

        return triton_cache.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
    return reference.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    scale: float,
    max_query_len: int,
    max_context_len: int,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    args = (q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, scale,
            max_query_len, max_context_len)
    if backend.use_triton(q):
        if max_query_len <= DECODE_MAX_QUERY_LEN:
            from hotpath.ops.attention import triton_decode

            return triton_decode.paged_attention(*args)
        from hotpath.ops.attention import triton_prefill

        return triton_prefill.paged_attention(*args)
    return reference.paged_attention(*args)


__all__ = ["paged_attention", "write_kv_cache"]
