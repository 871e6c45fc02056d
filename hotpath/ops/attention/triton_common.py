"""Pieces shared by the Triton prefill and decode attention kernels.

Both walk a sequence's keys in tiles of BLOCK_N positions, gathering each tile from the paged cache
through the block table, and keep a FlashAttention-style running softmax per query row:
m (running max of the scores, log2 units), l (running sum of exp2(score - m)) and acc (the
running sum of probabilities times values). Scores are computed in log2 units (q.k * scale * log2 e)
so the kernels use exp2.

An fp8 cache (e4m3; e4m3fnuz on AMD's gfx942) holds k / k_scale and v / v_scale, rounded to nearest
even (`to_cache`). Reading it, a tile is upcast to the query's dtype after its load (exact: every
e4m3 value is a bf16 value) and the scales are applied outside the dots: k_scale folded into the
score scale by the host, v_scale on the output (`kv_out_scale`). A 16- or 32-bit cache compiles to
the same code as before: the fp8 branches are resolved at compile time from the cache's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotpath.ops.quant.triton_quant import _to_fp8

LOG2E = 1.4426950408889634


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def dot_precision(dtype) -> str | None:
    """fp32: the full-precision dot; others: the target's default (gfx950 has no "tf32" to name)."""
    return "ieee" if str(dtype) == "torch.float32" else None


@triton.jit
def to_cache(
    x,  # any float tensor
    scale,  # fp32: the cache's scale (used for fp8 caches only)
    dtype: tl.constexpr,  # the cache's element type
):
    """x as a cache of `dtype` stores it: a plain cast, or for fp8 x / scale (IEEE division),
    clamped to the fp8 range and rounded to nearest even (explicitly: the interpreter's own
    fp32 -> fp8 cast rounds wrongly), as reference.quantize_kv does."""
    if dtype.is_fp8():
        FP8_MAX: tl.constexpr = 240.0 if dtype == tl.float8e4b8 else 448.0
        return _to_fp8(x.to(tl.float32), scale, FP8_MAX, dtype)
    else:
        return x.to(dtype)


@triton.jit
def query_for_cache(q, k_cache_ptr):
    """The query in the dtype the dots take: an fp8 cache's tiles convert to fp16 in one
    instruction per two values (to bf16, which has no such conversion, in several), exactly either
    way, so a bf16 query's dots run in fp16 (it converts exactly in fp16's normal range; p in
    [0, 1] rounds finer than in bf16). Otherwise the query's own dtype."""
    if k_cache_ptr.dtype.element_ty.is_fp8() and q.dtype == tl.bfloat16:
        return q.to(tl.float16)
    else:
        return q


@triton.jit
def kv_out_scale(out, v_scale, v_cache_ptr):
    """out (fp32, a normalised sum of probabilities times cached values) times v_scale when the
    cache is fp8; unchanged otherwise."""
    if v_cache_ptr.dtype.element_ty.is_fp8():
        return out * v_scale
    else:
        return out


@triton.jit
def load_kv_tile(
    cache_ptr,
    row_offsets,  # [BLOCK_N] int64 element offset of each key's row for this kv head
    d,  # [HEAD_DIM_PAD] arange
    n_ok,  # [BLOCK_N] bool, used only when MASK_N
    MASK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    ptrs = cache_ptr + row_offsets[:, None] + d[None, :]
    if HEAD_DIM == HEAD_DIM_PAD:
        if MASK_N:
            tile = tl.load(ptrs, mask=n_ok[:, None], other=0.0)
        else:
            tile = tl.load(ptrs)
    else:
        if MASK_N:
            tile = tl.load(ptrs, mask=n_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
        else:
            tile = tl.load(ptrs, mask=d[None, :] < HEAD_DIM, other=0.0)
    return tile  # [BLOCK_N, HEAD_DIM_PAD]


@triton.jit
def kv_tile_blocks(
    block_table_ptr,  # this sequence's row of the block table
    n,  # [BLOCK_N] key positions
    n_ok,  # [BLOCK_N] bool, used only when MASKED
    MASKED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """[BLOCK_N] int64 cache block of each key position n."""
    if MASKED:
        return tl.load(block_table_ptr + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    return tl.load(block_table_ptr + n // BLOCK_SIZE).to(tl.int64)


@triton.jit
def prefetch_l2(
    cache_ptr,
    row_offsets,  # [BLOCK_N] int64 element offset of each key's row for this kv head
    n_ok,  # [BLOCK_N] bool
    LINES: tl.constexpr,  # 128-byte lines per row (a power of 2)
):
    """Asks for the rows' 128-byte lines to be brought into L2 (PTX prefetch; NVIDIA only, for
    kernels that read them after PDL's wait). Nothing comes back into registers."""
    line = tl.arange(0, LINES) * (128 * 8 // cache_ptr.dtype.element_ty.primitive_bitwidth)
    ptrs = cache_ptr + row_offsets[:, None] + line[None, :]
    ok = (n_ok[:, None] & (line >= 0)[None, :]).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def attend_tile(
    acc,  # [BLOCK_M, HEAD_DIM_PAD] fp32
    l_i,  # [BLOCK_M] fp32
    m_i,  # [BLOCK_M] fp32
    q,  # [BLOCK_M, HEAD_DIM_PAD]
    q_pos,  # [BLOCK_M] position of each query row
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,  # this sequence's row of the block table
    n0,  # first key position of the tile
    n_end,  # keys at n_end and beyond are not read (used only when MASKED)
    kv_head,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    scale_log2,
    d,
    MASKED: tl.constexpr,  # apply the causal mask and the n < n_end bound
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < n_end
    blocks = kv_tile_blocks(block_table_ptr, n, n_ok, MASKED, BLOCK_SIZE)
    in_block = n % BLOCK_SIZE
    k_rows = blocks * stride_kb + in_block * stride_kt + kv_head * stride_kh
    v_rows = blocks * stride_vb + in_block * stride_vt + kv_head * stride_vh
    return attend_rows(acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, k_rows, v_rows, n, n_ok,
                       scale_log2, d, MASKED, HEAD_DIM, HEAD_DIM_PAD, PRECISION)


@triton.jit
def attend_rows(
    acc,  # [BLOCK_M, HEAD_DIM_PAD] fp32
    l_i,  # [BLOCK_M] fp32
    m_i,  # [BLOCK_M] fp32
    q,  # [BLOCK_M, HEAD_DIM_PAD]
    q_pos,  # [BLOCK_M] position of each query row
    k_cache_ptr,
    v_cache_ptr,
    k_rows,  # [BLOCK_N] int64 element offset of each key's row for this kv head
    v_rows,  # [BLOCK_N] the same for the values
    n,  # [BLOCK_N] key positions
    n_ok,  # [BLOCK_N] bool: the keys to read (used only when MASKED)
    scale_log2,
    d,
    MASKED: tl.constexpr,  # apply the causal mask and the n_ok bound
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """attend_tile for a tile whose cache rows are already known."""
    # (an fp8 tile upcast to the query's dtype, fp16 for fp8 caches: see query_for_cache; a no-op
    # for a cache of the query's dtype)
    k = load_kv_tile(k_cache_ptr, k_rows, d, n_ok, MASKED, HEAD_DIM, HEAD_DIM_PAD).to(q.dtype)
    # values loaded with the keys, not after the scores: one memory round a tile where nothing
    # pipelines it (a decode split of one tile)
    v = load_kv_tile(v_cache_ptr, v_rows, d, n_ok, MASKED, HEAD_DIM, HEAD_DIM_PAD).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen no visible key yet keeps m = -inf; shift it by 0 instead so that
    # exp2 gives 0 rather than exp2(-inf - -inf) = nan
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, l_i, m_new
