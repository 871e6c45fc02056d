"""Decode attention over the paged KV cache: flash-decoding, for steps whose queries are few per
sequence (a decode's one token, or the k+1 tokens of a speculative verify step).

One program handles (sequence, kv head, split of the context). Its query rows are every query token
of the sequence times every q head sharing that kv head (GQA), so each K/V tile is read from memory
once for the whole group and the dot products have enough rows for tensor cores. Splitting the
context lets batch-1 long-context decode use every SM; each split writes its normalised partial
output and log-sum-exp. A call of one query token a sequence (decode) then merges them in a
kernel of its own, a program per (token, head) (_merge_head_kernel); in calls with more query
tokens a sequence (verify steps) the last split of a (sequence, kv head) to finish (an atomic
counter says which) merges them. With a single split the program writes the output directly.

At batch 1 the kernel is a chain of latencies, not a stream of bytes (a 1k context is ~2 MB), so
it is arranged to have few dependent memory rounds after PDL's wait: before the wait, while the
qkv projection finishes, the first tile of keys and values of earlier steps is prefetched into L2
and the block table, cos/sin and the norm weights are read; after it, the projections in one
round, the tiles from L2, the partials' stores, and nothing more (the merge's fence, counter and
dependent read cost the chain more than a merge kernel of its own). Calls without splits, where
the batch fills the GPU, are occupancy-bound instead: they skip the prefetch and load the query
late, for fewer registers.

Past the wait the chain is mostly instructions, so the query is normed and rotated on its real
rows only (2 at one token and 2 q heads a kv head, not the 16 the dots take), and a split holding
one tile attends to it without the pipelined tile loop, from cache rows computed before the wait.
docs/decisions.md (attention) has the figures and what was tried and reverted.

The number of splits is fixed on the host (from the batch size and max_context_len, so a CUDA graph
captured with max_context_len = max_model_len stays valid), but each sequence spreads its own
context over them on the device, in whole tiles: a short context in a graph sized for a long one
uses as many splits as it has tiles, rather than leaving the work to the first.

With ROPE the kernel also does what ops/rotary's qk_norm_rope_and_cache does before it, saving that
launch in decode: each program normalises and rotates its query rows as it loads them, and the
program whose split holds a new position writes that token's rotated key and its value into the
cache (a block barrier orders that before the tiles read it back; no other program reads those
rows). With an fp8 cache those rows are quantized as they are written (k / k_scale, v / v_scale,
rounded to nearest even) and every tile is upcast to the query's dtype after its load
(triton_common).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.reference import kv_scales
from hotpath.ops.attention.triton_common import (
    LOG2E,
    attend_rows,
    attend_tile,
    dot_precision,
    kv_out_scale,
    kv_tile_blocks,
    next_power_of_2,
    prefetch_l2,
    query_for_cache,
    to_cache,
)
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    sm_count,
    zeroed_counters,
)

# Decode is bound by the bytes each SM keeps in flight: 16 KB key tiles, about four programs an SM,
# splits of at least 64 tokens, and none past a full GPU below LONG_CONTEXT (docs/decisions.md).
PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 64
LONG_CONTEXT = 4096
MAX_SPLITS = 128
TILE_BYTES = 64 * 128 * 2
# The merge's fp32 partials a round: one round for every split of a batch-1 decode with up to 4 q
# heads a kv head...
MERGE_ELEMENTS = 8192
# ...and at least this many splits a round (up to twice the partials): one round beats two
MIN_MERGE_SPLITS = 16
# A call of one query token a sequence (decode) merges its splits in a kernel of its own, a program
# per (token, head); verify steps (several tokens a sequence) merge in the last split of each kv
# head to finish (docs/decisions.md).
# splits the merge kernel reads a round (fp32 [32, 128] held in registers)
MERGE_KERNEL_SPLITS = 32
# two warps: a short kernel in a latency chain, timed against one and four
MERGE_KERNEL_WARPS = 2
# One merge counter per (sequence, kv head) of a split call; splitting stops well before this
MAX_SPLIT_GROUPS = 4096


def _counters(device: torch.device) -> torch.Tensor:
    """The merge counters, one per (sequence, kv head) of a split call."""
    return zeroed_counters("decode attention merge", MAX_SPLIT_GROUPS, device)


@triton.jit
def _partner(d, HALF: tl.constexpr):
    """Each dimension's rotate-half partner (itself past the rotary dims)."""
    return tl.where(d < HALF, d + HALF, tl.where(d < 2 * HALF, d - HALF, d))[None, :]


@triton.jit
def _rope_inputs(
    pos,  # [R, 1] int64 position of each row
    row_ok,  # [R, 1] bool
    d,  # [HEAD_DIM_PAD] arange
    cos_sin_ptr,  # [max_positions, 2 * HALF] fp32: cos then sin
    stride_cs,
    norm_w_ptr,  # [HEAD_DIM] (HAS_NORM)
    HAS_NORM: tl.constexpr,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """What QK-norm and RoPE of rows at `pos` take besides the rows: cos, sin [R, HEAD_DIM_PAD]
    and the norm weight at each dimension and at its partner [1, HEAD_DIM_PAD], fp32. No kernel of
    the step writes any of it, so it is loaded before PDL's wait."""
    dim_ok = d[None, :] < HEAD_DIM
    rotated = d[None, :] < 2 * HALF
    j = (d % HALF)[None, :]
    cs = cos_sin_ptr + pos * stride_cs
    cos = tl.load(cs + j, mask=row_ok & rotated, other=1.0)
    sin = tl.load(cs + HALF + j, mask=row_ok & rotated, other=0.0)
    if HAS_NORM:
        w = tl.load(norm_w_ptr + d[None, :], mask=dim_ok, other=0.0).to(tl.float32)
        wp = tl.load(norm_w_ptr + _partner(d, HALF), mask=dim_ok, other=0.0).to(tl.float32)
    else:
        w = cos  # unused
        wp = cos
    return cos, sin, w, wp


@triton.jit
def _load_rows(base, row_ok, d, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [R, HEAD_DIM_PAD] at `base` ([R, 1] pointers) and the same rows with each element
    replaced by its rotation partner (a second load, so the tile keeps its column order)."""
    mask = row_ok & (d[None, :] < HEAD_DIM)
    x = tl.load(base + d[None, :], mask=mask, other=0.0)
    xp = tl.load(base + _partner(d, HALF), mask=mask, other=0.0)
    return x, xp


@triton.jit
def _norm_rope(x, xp, cos, sin, w, wp, d, eps, HAS_NORM: tl.constexpr, HALF: tl.constexpr,
               HEAD_DIM: tl.constexpr):
    """Rows x [R, HEAD_DIM_PAD] after Qwen3's per-head RMSNorm (optional) and RoPE (GPT-NeoX
    rotate-half), rounding as ops/rotary's reference does; xp, cos, sin, w, wp from _load_rows
    and _rope_inputs."""
    dtype = x.dtype
    xf = x.to(tl.float32)
    xpf = xp.to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(xf * xf, 1) / HEAD_DIM + eps)[:, None]
        xf = ((xf * rstd).to(dtype).to(tl.float32) * w).to(dtype).to(tl.float32)
        xpf = ((xpf * rstd).to(dtype).to(tl.float32) * wp).to(dtype).to(tl.float32)
    sign = tl.where(d < HALF, -1.0, 1.0)[None, :]
    return tl.where(d[None, :] < 2 * HALF, xf * cos + sign * xpf * sin, xf).to(dtype)


@triton.jit
def _split_len(ctx, num_splits, BLOCK_N: tl.constexpr):
    """Keys per split for a context of `ctx`: whole tiles, spread over the splits."""
    return tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cu_query_lens_ptr,
    context_lens_ptr,
    block_tables_ptr,
    out_ptr,
    part_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32
    part_lse_ptr,  # [num_tokens, num_heads, num_splits] fp32, log2 units
    counter_ptr,  # [>= num_seqs * num_kv_heads] int32, zero between calls (unused if DIRECT)
    k_new_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM] this step's keys, before norm/RoPE (ROPE)
    v_new_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM] (ROPE)
    cos_sin_ptr,  # [max_positions, rotary_dim] fp32 (ROPE)
    rope_pos_ptr,  # [num_tokens] int64, each token's row of cos_sin (ROPE_POSITIONS)
    q_norm_w_ptr,  # [HEAD_DIM] (ROPE and HAS_NORM)
    k_norm_w_ptr,
    norm_eps,
    scale_log2,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    k_scale,  # fp8 cache: what ROPE's writes divide by (unused otherwise)
    v_scale,  # fp8 cache: the values' scale, on the output and ROPE's writes
    num_heads,
    num_splits,
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
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_cs,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    DIRECT: tl.constexpr,  # one split: the batch fills the GPU (occupancy-bound: few registers);
    # with splits, latency-bound: fewest memory rounds after PDL's wait, at a cost in registers
    MERGE_M: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    ROPE: tl.constexpr,  # q, k_new and v_new are raw projections: norm, rotate and cache them here
    # rotate at the positions given (mRoPE: a sequence's ids run apart from its cache positions)
    # rather than at the cache positions
    ROPE_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,  # >= the longest query
    KV_LINES: tl.constexpr,  # 128-byte lines in a cache row (L2 prefetch)
    DEFER: tl.constexpr,  # store the partials only: _merge_head_kernel merges them
    Q_ROWS: tl.constexpr,  # query rows normed and rotated (<= BLOCK_M, a power of 2)
):
    pdl_launch_dependents(USE_PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Before waiting for the previous kernel, only what no kernel of this step writes: the
    # step's inputs (written before the forward began) and, in split calls, the first tile of
    # keys and values of earlier steps (into L2), cos/sin and the norm weights. This step's cache
    # rows (ctx - q_len onwards) are not read before the wait: they are this kernel's (ROPE) or
    # the previous kernel's to write.
    q_start = tl.load(cu_query_lens_ptr + seq)
    q_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    ctx = tl.load(context_lens_ptr + seq)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    split_len = _split_len(ctx, num_splits, BLOCK_N)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)
    d = tl.arange(0, HEAD_DIM_PAD)
    n = start + tl.arange(0, BLOCK_N)
    n_ok = n < end
    first_new = ctx - q_len
    if not DIRECT:
        # the first tile's cache rows and, with PDL, its earlier keys and values into L2 (L2, not
        # registers: held across the wait they cost more registers than the wait saves)
        blocks = kv_tile_blocks(block_table, n, n_ok, True, BLOCK_SIZE)
        in_block = n % BLOCK_SIZE
        k_rows0 = blocks * stride_kb + in_block * stride_kt + kv_head * stride_kh
        v_rows0 = blocks * stride_vb + in_block * stride_vt + kv_head * stride_vh
        if USE_PDL:
            old = n_ok & (n < first_new)
            prefetch_l2(k_cache_ptr, k_rows0, old, KV_LINES)
            prefetch_l2(v_cache_ptr, v_rows0, old, KV_LINES)

    rows = tl.arange(0, BLOCK_M)  # row = query token * GROUP + head within the group
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = tok < q_len
    q_pos = first_new + tok
    row_mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    token = (q_start + tok).to(tl.int64)
    # the query rows are loaded, normed and rotated as Q_ROWS rows (the real ones, padded to a
    # power of 2), then repeated to the BLOCK_M the dots take: at one token a sequence and 2 q
    # heads a kv head that is 2 rows of work rather than 16
    qr = tl.arange(0, Q_ROWS)
    q_tok = qr // GROUP
    # a query needs its own key in the context (ctx >= q_len); rows that break that (a padding
    # row with an empty context) load nothing: their position would be negative
    q_ok = (q_tok < q_len) & (first_new + q_tok >= 0)
    q_rows = (q_ptr + (q_start + q_tok).to(tl.int64)[:, None] * stride_qt
              + (kv_head * GROUP + qr % GROUP)[:, None] * stride_qh)
    if ROPE:
        # this step's tokens whose positions fall in this split: their keys and values go into
        # the cache here (the split that reads a position writes it, so no other program
        # depends on the write)
        t = tl.arange(0, BLOCK_T)
        t_pos = first_new + t
        mine = ((t < q_len) & (t_pos >= start) & (t_pos < end))[:, None]
        t_pos = t_pos.to(tl.int64)[:, None]
        q_rope_pos = (first_new + q_tok).to(tl.int64)[:, None]
        k_rope_pos = t_pos
        if ROPE_POSITIONS:
            q_rope_pos = tl.load(rope_pos_ptr + (q_start + q_tok)[:, None], mask=q_ok[:, None], other=0)
            k_rope_pos = tl.load(rope_pos_ptr + q_start + t[:, None], mask=mine, other=0)
        if not DIRECT:
            q_cos, q_sin, q_w, q_wp = _rope_inputs(q_rope_pos, q_ok[:, None], d, cos_sin_ptr, stride_cs,
                                                   q_norm_w_ptr, HAS_NORM, HALF, HEAD_DIM)
            k_cos, k_sin, k_w, k_wp = _rope_inputs(k_rope_pos, mine, d, cos_sin_ptr, stride_cs,
                                                   k_norm_w_ptr, HAS_NORM, HALF, HEAD_DIM)
            t_block = tl.load(block_table + t_pos // BLOCK_SIZE, mask=mine, other=0).to(tl.int64)
    pdl_wait(USE_PDL)

    if ROPE:
        t_token = (q_start + t).to(tl.int64)[:, None]
        t_mask = mine & (d[None, :] < HEAD_DIM)
        if not DIRECT:
            # the projections in one round, the query rotated first (ahead of the cache write)
            xq, xq_p = _load_rows(q_rows, q_ok[:, None], d, HALF, HEAD_DIM)
        xk, xk_p = _load_rows(k_new_ptr + t_token * stride_knt + kv_head * stride_knh, mine, d,
                              HALF, HEAD_DIM)
        v_step = to_cache(tl.load(v_new_ptr + t_token * stride_vnt + kv_head * stride_vnh + d[None, :],
                                  mask=t_mask, other=0.0), v_scale, v_cache_ptr.dtype.element_ty)
        if not DIRECT:
            q = _norm_rope(xq, xq_p, q_cos, q_sin, q_w, q_wp, d, norm_eps, HAS_NORM, HALF, HEAD_DIM)
        else:
            k_cos, k_sin, k_w, k_wp = _rope_inputs(k_rope_pos, mine, d, cos_sin_ptr, stride_cs,
                                                   k_norm_w_ptr, HAS_NORM, HALF, HEAD_DIM)
            t_block = tl.load(block_table + t_pos // BLOCK_SIZE, mask=mine, other=0).to(tl.int64)
        # rounded to the model dtype first, as the reference's rotated key is
        k_step = to_cache(_norm_rope(xk, xk_p, k_cos, k_sin, k_w, k_wp, d, norm_eps, HAS_NORM, HALF,
                                     HEAD_DIM), k_scale, k_cache_ptr.dtype.element_ty)
        t_row = t_pos % BLOCK_SIZE
        tl.store(k_cache_ptr + t_block * stride_kb + t_row * stride_kt + kv_head * stride_kh + d[None, :],
                 k_step, mask=t_mask)
        tl.store(v_cache_ptr + t_block * stride_vb + t_row * stride_vt + kv_head * stride_vh + d[None, :],
                 v_step, mask=t_mask)
        if DIRECT:
            # the query's rows and RoPE inputs only now: fewer live registers, more programs an SM
            xq, xq_p = _load_rows(q_rows, q_ok[:, None], d, HALF, HEAD_DIM)
            q_cos, q_sin, q_w, q_wp = _rope_inputs(q_rope_pos, q_ok[:, None], d, cos_sin_ptr, stride_cs,
                                                   q_norm_w_ptr, HAS_NORM, HALF, HEAD_DIM)
            q = _norm_rope(xq, xq_p, q_cos, q_sin, q_w, q_wp, d, norm_eps, HAS_NORM, HALF, HEAD_DIM)
        # the tiles below read the new rows back: the block's stores first
        tl.debug_barrier()
    else:
        q = tl.load(q_rows + d[None, :], mask=q_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    if Q_ROWS < BLOCK_M:
        # row r of the dots' query tile is row r % Q_ROWS: real rows stay in place, the padding
        # rows repeat them (and are never stored)
        q = tl.reshape(tl.broadcast_to(q[None, :, :], (BLOCK_M // Q_ROWS, Q_ROWS, HEAD_DIM_PAD)),
                       (BLOCK_M, HEAD_DIM_PAD))
    q = query_for_cache(q, k_cache_ptr)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    # (the loop is written twice: a flag set under a compile-time condition and tested after it is
    # a run-time value to Triton, which then compiles both sides, and DIRECT has no rows from
    # before the wait for the one-tile side)
    if not DIRECT:
        if (start < end) & (end - start <= BLOCK_N):
            # a split of one tile (every split, while the context is at most the splits x
            # BLOCK_N): its rows are known from before the wait, and no loop pipelines loads
            # for a next tile that does not exist
            acc, l_i, m_i = attend_rows(
                acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, k_rows0, v_rows0, n, n_ok,
                scale_log2, d, True, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
            )
        else:
            for n0 in range(start, end, BLOCK_N):
                acc, l_i, m_i = attend_tile(
                    acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table, n0, end, kv_head,
                    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2, d,
                    True, BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
                )
    else:
        for n0 in range(start, end, BLOCK_N):
            acc, l_i, m_i = attend_tile(
                acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, block_table, n0, end, kv_head,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, scale_log2, d,
                True, BLOCK_N, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, PRECISION,
            )

    if DIRECT:
        # one split holds the whole context, so every real row has seen at least its own key
        out = kv_out_scale(acc / l_i[:, None], v_scale, v_cache_ptr)
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask,
        )
    elif start < ctx:  # splits past the context store nothing and do not count
        # a split past a row's position has seen nothing: weight 0
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
        part = (token * num_heads + head) * num_splits + split
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + d[None, :],
            kv_out_scale(acc / l_safe[:, None], v_scale, v_cache_ptr), mask=row_mask,
        )
        if not DEFER:
            # every thread's partials are stored before the (one-thread, acq_rel) atomic
            # publishes them; the last split of this (sequence, kv head) to arrive merges them
            tl.debug_barrier()
            counter = counter_ptr + seq * tl.num_programs(1) + kv_head
            used = tl.cdiv(ctx, split_len)
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == used - 1:
                tl.store(counter, 0)
                _merge_splits(part_out_ptr, part_lse_ptr, out_ptr, q_start, q_len, kv_head, used,
                              num_heads, num_splits, stride_ot, stride_oh, d, GROUP, MERGE_M,
                              SPLIT_CHUNK, HEAD_DIM)


@triton.jit
def _merge_splits(
    part_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32
    part_lse_ptr,  # [num_tokens, num_heads, num_splits] fp32, log2 units
    out_ptr,
    q_start,
    q_len,
    kv_head,
    used,  # the splits that hold part of the context: 0 .. used - 1
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    d,  # [HEAD_DIM_PAD] arange
    GROUP: tl.constexpr,
    MERGE_M: tl.constexpr,  # >= q_len * GROUP, the rows of one (sequence, kv head)
    SPLIT_CHUNK: tl.constexpr,  # splits read per round
    HEAD_DIM: tl.constexpr,
):
    """out = the splits' partial outputs weighted by 2^lse, for every query row of one (sequence,
    kv head). At batch 1 every split is read in one round (SPLIT_CHUNK x MERGE_M x HEAD_DIM_PAD
    fp32 fits the registers); more splits or rows take more rounds, merged with a running max.
    The partials were stored by other programs: read with .cg, from L2, not this SM's L1."""
    r = tl.arange(0, MERGE_M)
    tok = r // GROUP
    head = kv_head * GROUP + r % GROUP
    r_ok = tok < q_len
    token = (q_start + tok).to(tl.int64)
    base = (token * num_heads + head) * num_splits  # [MERGE_M] each row's first partial
    run_max = tl.full([MERGE_M], float("-inf"), tl.float32)
    weight_sum = tl.zeros([MERGE_M], tl.float32)
    acc = tl.zeros([MERGE_M, d.shape[0]], tl.float32)
    for s0 in range(0, used, SPLIT_CHUNK):
        c = s0 + tl.arange(0, SPLIT_CHUNK)
        ok = (c < used)[:, None] & r_ok[None, :]  # [SPLIT_CHUNK, MERGE_M]
        idx = base[None, :] + c[:, None]
        lse = tl.load(part_lse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(part_out_ptr + idx[:, :, None] * HEAD_DIM + d[None, None, :],
                       mask=ok[:, :, None] & (d < HEAD_DIM)[None, None, :], other=0.0,
                       cache_modifier=".cg")  # [SPLIT_CHUNK, MERGE_M, HEAD_DIM_PAD]
        new_max = tl.maximum(run_max, tl.max(lse, 0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows with nothing seen yet
        weight = tl.exp2(lse - shift[None, :])  # splits a row has not seen weigh 0
        rescale = tl.exp2(run_max - shift)
        acc = acc * rescale[:, None] + tl.sum(part * weight[:, :, None], 0)
        weight_sum = weight_sum * rescale + tl.sum(weight, 0)
        run_max = new_max
    # every real row has seen its own key in some split
    out = acc / tl.where(r_ok, weight_sum, 1.0)[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & (d[None, :] < HEAD_DIM))


@triton.jit
def _merge_head_kernel(
    part_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32
    part_lse_ptr,  # [num_tokens, num_heads, num_splits] fp32, log2 units
    context_lens_ptr,  # [num_tokens] int32: one query token a sequence
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per attention tile: a split holds whole tiles
    BLOCK_S: tl.constexpr,  # splits merged a round
    USE_PDL: tl.constexpr,
):
    """One head of one token's split partials merged (DEFER), in a call of one query token a
    sequence (token t is sequence t): a program per (token, head), each the last-split merge of a
    one-row group."""
    pdl_launch_dependents(USE_PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    ctx = tl.load(context_lens_ptr + token)
    # the splits holding context; the others store nothing (a query token sees >= 1 key)
    used = tl.cdiv(ctx, tl.maximum(_split_len(ctx, num_splits, BLOCK_N), 1))
    pdl_wait(USE_PDL)
    _merge_splits(part_out_ptr, part_lse_ptr, out_ptr, token, 1, head, used, num_heads, num_splits,
                  stride_ot, stride_oh, tl.arange(0, HEAD_DIM_PAD), 1, 1, BLOCK_S, HEAD_DIM)


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device
) -> int:
    """Enough splits to give every SM about PROGRAMS_PER_SM programs, none (at the longest
    context) shorter than MIN_SPLIT_TOKENS; one split once the batch alone fills the SMs, unless
    the contexts reach LONG_CONTEXT."""
    programs = num_seqs * num_kv_heads
    num_sms = sm_count(device)
    if programs >= num_sms and max_context_len < LONG_CONTEXT:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    return max(1, min(wanted, triton.cdiv(max_context_len, MIN_SPLIT_TOKENS), MAX_SPLITS))


def merge_chunk(num_splits: int, row_elements: int) -> int:
    """Splits the merge reads a round, each `row_elements` fp32 partials (query rows of a
    (sequence, kv head) x padded head_dim)."""
    chunk = max(1, MERGE_ELEMENTS // row_elements)
    if MIN_MERGE_SPLITS * row_elements <= 2 * MERGE_ELEMENTS:
        chunk = max(chunk, MIN_MERGE_SPLITS)
    return min(next_power_of_2(num_splits), chunk)


def choose_block_n(head_dim_pad: int, elem_size: int, tokens_per_split: int) -> int:
    """Keys per tile: TILE_BYTES of keys, fewer when the splits are shorter."""
    block_n = max(16, TILE_BYTES // (head_dim_pad * elem_size))
    return max(16, min(block_n, next_power_of_2(tokens_per_split)))


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
    num_splits: int | None = None,  # tuning and tests: force the number of context splits
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
    rope: tuple | None = None,
    rope_positions: torch.Tensor | None = None,  # [num_tokens] int64, with rope
    k_scale: float = 1.0,  # fp8 cache: k = k_cache * k_scale (ignored for other caches)
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Same contract as reference.paged_attention; meant for small max_query_len (decode, verify).

    With `rope` = (k, v, cos_sin_cache, q_norm_weight, k_norm_weight, eps), q, k and v are the raw
    projections of this step's tokens and the kernel first does what qk_norm_rope_and_cache does
    (QK-norm when the weights are given, RoPE, k and v into the cache), cache slots being the last
    query_len of each sequence's context, through its block table, and so are the positions it
    rotates at unless `rope_positions` names them (mRoPE models). One launch fewer per layer. An
    fp8 cache holds k / k_scale and v / v_scale (the rows ROPE writes too)."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = context_lens.shape[0]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    head_dim_pad = max(16, next_power_of_2(head_dim))
    block_m = max(16, next_power_of_2(max_query_len * group))
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, q.device)
    if block_n is None:
        block_n = choose_block_n(
            head_dim_pad, k_cache.element_size(), triton.cdiv(max_context_len, num_splits)
        )
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    direct = num_splits == 1
    # one token a sequence, with splits: the merge as a kernel of its own (_merge_head_kernel)
    defer = not direct and max_query_len == 1 and num_tokens == num_seqs
    merge_m = next_power_of_2(max_query_len * group)
    counters = _counters(q.device)
    if direct:
        part_out = part_lse = out  # unused
    else:
        if num_seqs * num_kv_heads > MAX_SPLIT_GROUPS:
            raise ValueError(f"split decode attention takes at most {MAX_SPLIT_GROUPS} (sequence, kv head) "
                             f"pairs, got {num_seqs * num_kv_heads}")
        part_out = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            (num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device
        )
    use_pdl = pdl_enabled(q.device)
    if rope is not None:
        k_new, v_new, cos_sin, q_norm_w, k_norm_w, norm_eps = rope
        assert k_new.stride(2) == 1 and v_new.stride(2) == 1 and cos_sin.stride(1) == 1
        assert cos_sin.shape[1] % 2 == 0 and cos_sin.shape[1] <= head_dim
        has_norm = q_norm_w is not None
        rope_args = (k_new, v_new, cos_sin, q if rope_positions is None else rope_positions,
                     q_norm_w if has_norm else q, k_norm_w if has_norm else q, norm_eps)
        rope_strides = (k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
                        cos_sin.stride(0))
        half = cos_sin.shape[1] // 2
    else:
        assert rope_positions is None, "rope_positions without rope"
        has_norm, half = False, 1
        rope_args, rope_strides = (q, q, q, q, q, q, 0.0), (0, 0, 0, 0, 0)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, cu_query_lens, context_lens, block_tables,
        out, part_out, part_lse, counters, *rope_args,
        scale * LOG2E * k_scale, k_scale, v_scale, num_heads, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1), *rope_strides,
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, DIRECT=direct, MERGE_M=merge_m,
        SPLIT_CHUNK=merge_chunk(num_splits, merge_m * head_dim_pad),
        PRECISION=dot_precision(q.dtype), USE_PDL=use_pdl, ROPE=rope is not None,
        ROPE_POSITIONS=rope_positions is not None,
        HAS_NORM=has_norm, HALF=half, BLOCK_T=max(2, next_power_of_2(max_query_len)),
        KV_LINES=max(1, head_dim_pad * k_cache.element_size() // 128), DEFER=defer,
        Q_ROWS=merge_m,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(use_pdl),
    )
    if defer:
        _merge_head_kernel[(num_tokens, num_heads)](
            part_out, part_lse, context_lens, out, num_heads, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_N=block_n,
            BLOCK_S=min(next_power_of_2(num_splits), MERGE_KERNEL_SPLITS), USE_PDL=use_pdl,
            num_warps=MERGE_KERNEL_WARPS, **pdl_launch(use_pdl),
        )
    return out
