"""Attention over the paged KV cache.

`paged_attention` runs the readable reference on the CPU and a Triton kernel on the GPU (see
hotpath/ops/backend.py): the flash-decoding kernel when every sequence brings few queries (decode,
speculative verify), the FlashAttention-style prefill kernel otherwise.

The cache is in the model's dtype or in fp8 (kv_cache_dtype="fp8"): then it holds k / k_scale and
v / v_scale, per-layer scales every op here takes as `k_scale` / `v_scale` (see reference.py).
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
    k_scale: float = 1.0,  # fp8 cache: k_cache holds k / k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> None:
    args = (k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if backend.use_triton(k):
        from hotpath.ops.attention import triton_cache

        return triton_cache.write_kv_cache(*args)
    return reference.write_kv_cache(*args)


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
    k_scale: float = 1.0,  # fp8 cache: k = k_cache * k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    args = (q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, scale,
            max_query_len, max_context_len)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if backend.use_triton(q):
        if max_query_len <= DECODE_MAX_QUERY_LEN:
            from hotpath.ops.attention import triton_decode

            return triton_decode.paged_attention(*args, **scales)
        from hotpath.ops.attention import triton_prefill

        return triton_prefill.paged_attention(*args, **scales)
    return reference.paged_attention(*args, **scales)


def decode_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """How many programs a decode call of `num_seqs` one-token sequences spreads each context
    over when the longest may be `max_context_len` (1 where the reference runs): the grid a CUDA
    graph of that call holds, whatever the contexts it then replays with."""
    if backend.use_triton(torch.empty(0, device=device)):
        from hotpath.ops.attention import triton_decode

        return triton_decode.choose_num_splits(num_seqs, num_kv_heads, max_context_len, device)
    return 1


def rope_and_paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], raw projection (any token/head strides)
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], raw
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] fp32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    q_norm_weight: torch.Tensor | None,  # [head_dim]; Qwen3's per-head RMSNorm, or None
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    scale: float,
    max_query_len: int,
    max_context_len: int,
    k_scale: float = 1.0,  # fp8 cache: it holds k / k_scale and v / v_scale (ignored otherwise)
    v_scale: float = 1.0,
    positions_apart: bool = False,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """qk_norm_rope_and_cache, then paged_attention. For decode-sized steps on the GPU the
    decode kernel does both in one launch; it derives each token's position and cache slot from
    its sequence's context length and block table (the last query_len positions), which is how
    the engine builds `positions` and `slot_mapping`, unless `positions_apart` (mRoPE models,
    whose positions are not the cache's): then it rotates at `positions`."""
    if backend.use_triton(q) and max_query_len <= DECODE_MAX_QUERY_LEN:
        from hotpath.ops.attention import triton_decode

        return triton_decode.paged_attention(
            q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, scale, max_query_len,
            max_context_len, rope=(k, v, cos_sin_cache, q_norm_weight, k_norm_weight, eps),
            rope_positions=positions if positions_apart else None,
            k_scale=k_scale, v_scale=v_scale,
        )
    from hotpath.ops.rotary import qk_norm_rope_and_cache

    q = qk_norm_rope_and_cache(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                               q_norm_weight, k_norm_weight, eps, k_scale, v_scale)
    return paged_attention(q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, scale,
                           max_query_len, max_context_len, k_scale, v_scale)


__all__ = ["decode_splits", "paged_attention", "rope_and_paged_attention", "write_kv_cache"]
