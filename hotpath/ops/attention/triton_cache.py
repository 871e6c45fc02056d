"""Writing new tokens' K/V into the paged cache (one program per token, both caches at once); an
fp8 cache gets k / k_scale and v / v_scale, rounded to nearest even (triton_common.to_cache)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.triton_common import next_power_of_2, to_cache
from hotpath.ops.attention.reference import kv_scales


@triton.jit
def store_kv_heads(
    cache_ptr,
    values,  # [HEADS_PAD, HEAD_DIM_PAD]
    scale,  # fp8 cache: values are stored divided by it (unused otherwise)
    slot,  # int64 flat slot
    h,  # [HEADS_PAD] arange
    d,  # [HEAD_DIM_PAD] arange
    num_kv_heads,
    stride_b,
    stride_t,
    stride_h,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Stores one token's K (or V) heads at its slot, whatever the cache's strides (quantized for
    an fp8 cache)."""
    row = (slot // BLOCK_SIZE) * stride_b + (slot % BLOCK_SIZE) * stride_t
    ptrs = cache_ptr + row + h[:, None] * stride_h + d[None, :]
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < HEAD_DIM)
    tl.store(ptrs, to_cache(values, scale, cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale,
    v_scale,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # no slot (the reference requires slots >= 0): never write out of bounds
        return
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    store_kv_heads(k_cache_ptr, k, k_scale, slot, h, d, num_kv_heads, stride_kcb, stride_kct,
                   stride_kch, BLOCK_SIZE, HEAD_DIM)
    store_kv_heads(v_cache_ptr, v, v_scale, slot, h, d, num_kv_heads, stride_vcb, stride_vct,
                   stride_vch, BLOCK_SIZE, HEAD_DIM)


def write_kv_cache(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (any strides, head_dim contiguous)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (a negative slot is skipped)
    k_scale: float = 1.0,  # fp8 cache: k_cache holds k / k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, num_kv_heads,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEADS_PAD=next_power_of_2(num_kv_heads), HEAD_DIM_PAD=next_power_of_2(head_dim),
        num_warps=4,
    )
