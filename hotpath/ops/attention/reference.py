"""Readable paged attention: the reference every attention kernel is tested against.

Cache layout (one pair per attention layer):
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
A token at position p of a sequence lives in block block_table[p // block_size], row p % block_size;
its flat slot is block_id * block_size + p % block_size. That is the index order; the memory order
may differ (the tensors may be strided views, e.g. of [num_blocks, num_kv_heads, block_size,
head_dim] storage): the reference and the kernels only need head_dim to be contiguous.

The cache's dtype is the model's, or fp8 (e4m3fn; e4m3fnuz on AMD's gfx942) with a scale per layer
for K and one for V: it holds k / k_scale clamped to the fp8 range and rounded to nearest even, and
k = k_cache * k_scale is what attention reads (`quantize_kv`, `dequantize_kv`). The scales of a
16- or 32-bit cache are ignored.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def kv_scales(cache_dtype: torch.dtype, k_scale: float, v_scale: float) -> tuple[float, float]:
    """The (k_scale, v_scale) a cache of `cache_dtype` is read and written with: 1.0 for a 16- or
    32-bit cache, which stores values as they are; an fp8 cache's own, which must be positive."""
    if cache_dtype not in FP8_KV_DTYPES:
        return 1.0, 1.0
    if not (0 < k_scale < float("inf") and 0 < v_scale < float("inf")):
        raise ValueError(f"an fp8 KV cache's scales must be positive and finite, got k_scale={k_scale}, "
                         f"v_scale={v_scale}")
    return float(k_scale), float(v_scale)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x as a cache of `dtype` stores it: for fp8, x / scale (fp32) clamped to the fp8 range (no
    NaN for large values) and rounded to nearest even; otherwise a plain cast."""
    if dtype not in FP8_KV_DTYPES:
        return x.to(dtype)
    fmax = torch.finfo(dtype).max
    # divided by a tensor on x's device: torch's CUDA division by a Python number multiplies by
    # its reciprocal, which can round differently from the kernels' IEEE division
    divisor = torch.tensor(scale, dtype=torch.float32, device=x.device)
    return (x.float() / divisor).clamp(-fmax, fmax).to(dtype)


def dequantize_kv(cache: torch.Tensor, scale: float) -> torch.Tensor:
    """Cached K or V (any shape) as fp32 values."""
    if cache.dtype not in FP8_KV_DTYPES:
        return cache.float()
    return cache.float() * scale


def write_kv_cache(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, flat slot of each new token (>= 0)
    k_scale: float = 1.0,  # fp8 cache: k_cache holds k / k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> None:
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    block_size = k_cache.shape[1]
    blocks, rows = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, rows] = quantize_kv(k, k_cache.dtype, k_scale)
    v_cache[blocks, rows] = quantize_kv(v, v_cache.dtype, v_scale)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32, offsets of each sequence's queries in q
    context_lens: torch.Tensor,  # [num_seqs] int32, tokens in the cache incl. this step's
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    scale: float,
    max_query_len: int,  # largest query_len in the batch (the kernels size their grids from these
    max_context_len: int,  # two host-side ints; the reference has no need of them)
    k_scale: float = 1.0,  # fp8 cache: k = k_cache * k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new queries over its whole cached context.

    The queries of a sequence are its last `query_len` positions, so one formula serves a prefill,
    a prefill chunk after cached tokens (chunked prefill, prefix-cache hit), a decode (query_len 1)
    and a multi-token verify step. The new tokens' K/V must already be in the cache.
    """
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    cu = cu_query_lens.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        start, end = cu[i], cu[i + 1]
        query_len = end - start
        num_blocks = -(-ctx // block_size)
        blocks = block_tables[i, :num_blocks].long()
        # [ctx, num_kv_heads, head_dim] -> [num_heads, ctx, head_dim]
        k = dequantize_kv(k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx], k_scale)
        v = dequantize_kv(v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx], v_scale)
        k = k.transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0)
        qs = q[start:end].float().transpose(0, 1)  # [num_heads, query_len, head_dim]
        scores = torch.matmul(qs, k.transpose(1, 2)) * scale  # [num_heads, query_len, ctx]
        # query j sits at position ctx - query_len + j and sees keys at positions <= it
        q_pos = torch.arange(ctx - query_len, ctx, device=q.device)[:, None]
        k_pos = torch.arange(ctx, device=q.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.matmul(probs, v).transpose(0, 1).to(q.dtype)
    return out
