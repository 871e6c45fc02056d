"""RoPE kernels, plain and fused with Qwen3's QK-norm and the KV-cache write.

One program per token handles all of its heads: it loads the token's cos/sin row once, normalises
and rotates q into a new tensor and k straight into the cache, and copies v into the cache, so the
projections' output is read once and nothing between them and attention costs another launch.
Rounding follows the reference (norm rounded to the model dtype before and after its weight, RoPE in
fp32). An fp8 cache gets the rotated key rounded to the model dtype, then k / k_scale rounded to
nearest even (and v / v_scale), as the reference writes it (ops/attention's to_cache).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.reference import kv_scales
from hotpath.ops.attention.triton_common import to_cache
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait, tl_dtype


@triton.jit
def _norm_rope_heads(
    src,  # this token's first head
    stride_src_h,
    dst,  # where its first head goes
    stride_dst_h,
    dst_scale,  # an fp8 dst (the key cache) holds x / dst_scale
    num_heads,
    cos,  # [1, HALF_PAD] fp32
    sin,
    weight_ptr,  # [HEAD_DIM] norm weight (ignored unless HAS_NORM)
    eps,
    HAS_NORM: tl.constexpr,
    NORM_DTYPE: tl.constexpr,  # the norm's output dtype in the reference
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    REST: tl.constexpr,  # head_dim - rotary_dim: passed through unrotated
    REST_PAD: tl.constexpr,
):
    h = tl.arange(0, HEADS_PAD)[:, None]
    j = tl.arange(0, HALF_PAD)[None, :]
    m = (h < num_heads) & (j < HALF)
    x1 = tl.load(src + h * stride_src_h + j, mask=m, other=0.0)
    x2 = tl.load(src + h * stride_src_h + HALF + j, mask=m, other=0.0)
    in_dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if REST > 0:
        r = tl.arange(0, REST_PAD)[None, :]
        mr = (h < num_heads) & (r < REST)
        x3 = tl.load(src + h * stride_src_h + 2 * HALF + r, mask=mr, other=0.0).to(tl.float32)
    if HAS_NORM:
        sq = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
        if REST > 0:
            sq += tl.sum(x3 * x3, 1)
        rstd = tl.rsqrt(sq / (2 * HALF + REST) + eps)[:, None]
        w1 = tl.load(weight_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        x1 = ((x1 * rstd).to(in_dtype).to(tl.float32) * w1).to(NORM_DTYPE).to(tl.float32)
        x2 = ((x2 * rstd).to(in_dtype).to(tl.float32) * w2).to(NORM_DTYPE).to(tl.float32)
        if REST > 0:
            w3 = tl.load(weight_ptr + 2 * HALF + r, mask=r < REST, other=0.0).to(tl.float32)
            x3 = ((x3 * rstd).to(in_dtype).to(tl.float32) * w3).to(NORM_DTYPE).to(tl.float32)
    out_ty = dst.dtype.element_ty
    if out_ty.is_fp8():
        # the reference rounds the rotated rows to the norm's dtype, then quantizes them
        y1 = to_cache((x1 * cos - x2 * sin).to(NORM_DTYPE), dst_scale, out_ty)
        y2 = to_cache((x2 * cos + x1 * sin).to(NORM_DTYPE), dst_scale, out_ty)
    else:
        y1 = (x1 * cos - x2 * sin).to(out_ty)
        y2 = (x2 * cos + x1 * sin).to(out_ty)
    tl.store(dst + h * stride_dst_h + j, y1, mask=m)
    tl.store(dst + h * stride_dst_h + HALF + j, y2, mask=m)
    if REST > 0:
        tl.store(dst + h * stride_dst_h + 2 * HALF + r, to_cache(x3, dst_scale, out_ty), mask=mr)


@triton.jit
def _load_cos_sin(cos_sin_ptr, positions_ptr, token, stride_cs, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    pos = tl.load(positions_ptr + token).to(tl.int64)
    j = tl.arange(0, HALF_PAD)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cs + j, mask=j < HALF, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + j, mask=j < HALF, other=0.0)
    return cos, sin


@triton.jit
def _qk_norm_rope_cache_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    positions_ptr,
    cos_sin_ptr,
    slot_mapping_ptr,
    q_weight_ptr,
    k_weight_ptr,
    eps,
    k_scale,  # fp8 caches: they hold k / k_scale and v / v_scale (unused otherwise)
    v_scale,
    num_heads,
    num_kv_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    stride_cs,
    HAS_NORM: tl.constexpr,
    Q_NORM_DTYPE: tl.constexpr,
    K_NORM_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    REST: tl.constexpr,
    REST_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _load_cos_sin(cos_sin_ptr, positions_ptr, token, stride_cs, HALF, HALF_PAD)
    _norm_rope_heads(
        q_ptr + token * stride_qt, stride_qh, q_out_ptr + token * stride_ot, stride_oh, 1.0, num_heads,
        cos, sin, q_weight_ptr, eps, HAS_NORM, Q_NORM_DTYPE, HEADS_PAD, HALF, HALF_PAD, REST,
        REST_PAD,
    )
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # no slot (the reference requires slots >= 0): never write out of bounds
        block = slot // BLOCK_SIZE
        row = slot % BLOCK_SIZE
        _norm_rope_heads(
            k_ptr + token * stride_kt, stride_kh, k_cache_ptr + block * stride_kcb + row * stride_kct,
            stride_kch, k_scale, num_kv_heads, cos, sin, k_weight_ptr, eps, HAS_NORM, K_NORM_DTYPE,
            KV_HEADS_PAD, HALF, HALF_PAD, REST, REST_PAD,
        )
        h = tl.arange(0, KV_HEADS_PAD)[:, None]
        d = tl.arange(0, HEAD_DIM_PAD)[None, :]
        mask = (h < num_kv_heads) & (d < HEAD_DIM)
        v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d, mask=mask)
        dst = v_cache_ptr + block * stride_vcb + row * stride_vct + h * stride_vch + d
        tl.store(dst, to_cache(v, v_scale, v_cache_ptr.dtype.element_ty), mask=mask)


def _rotary_dims(head_dim: int, cos_sin_cache: torch.Tensor) -> tuple[int, int, int, int]:
    rotary_dim = cos_sin_cache.shape[1]
    assert rotary_dim % 2 == 0 and rotary_dim <= head_dim
    half, rest = rotary_dim // 2, head_dim - rotary_dim
    return half, triton.next_power_of_2(half), rest, triton.next_power_of_2(max(rest, 1))


def qk_norm_rope_and_cache(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] (any token/head strides)
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] fp32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (any strides, head_dim contiguous)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64 (a negative slot is skipped)
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,  # fp8 cache: k_cache holds k / k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and cos_sin_cache.stride(1) == 1
    half, half_pad, rest, rest_pad = _rotary_dims(head_dim, cos_sin_cache)
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    has_norm = q_norm_weight is not None
    q_dtype = torch.promote_types(q.dtype, q_norm_weight.dtype) if has_norm else q.dtype
    k_dtype = torch.promote_types(k.dtype, k_norm_weight.dtype) if has_norm else k.dtype
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q_dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    heads_pad = triton.next_power_of_2(num_heads)
    use_pdl = pdl_enabled(q.device)
    _qk_norm_rope_cache_kernel[(num_tokens,)](
        q, k, v, q_out, k_cache, v_cache, positions, cos_sin_cache, slot_mapping,
        q_norm_weight if has_norm else q, k_norm_weight if has_norm else k, eps, k_scale, v_scale,
        num_heads, num_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        cos_sin_cache.stride(0),
        HAS_NORM=has_norm, Q_NORM_DTYPE=tl_dtype(q_dtype), K_NORM_DTYPE=tl_dtype(k_dtype),
        BLOCK_SIZE=k_cache.shape[1], HEADS_PAD=heads_pad,
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim), HALF=half, HALF_PAD=half_pad,
        REST=rest, REST_PAD=rest_pad, USE_PDL=use_pdl,
        num_warps=4 if heads_pad * head_dim <= 4096 else 8, **pdl_launch(use_pdl),
    )
    return q_out
