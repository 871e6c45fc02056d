"""Fused MoE for few tokens (decode at batch 1 to FEW_TOKENS): two launches that read only the
routed experts' weights, each distinct expert's once, streamed as the dense GEMV streams a
weight (hotpath.ops.linear.triton_gemv).

At a few tokens an expert's projection is a weight read with a few rows of x, so the kernels are
streams over the routed experts' weights, spread over many programs:

- the grid is (pair p, N tile): pair p = t * k + j is token t's j-th expert. The program of the
  first pair routed to an expert (the lowest p with that expert) does that expert's N tile for
  every token routed to it; the programs of later pairs to the same expert exit at once. So each
  distinct expert is read once however many tokens share it (at batch 16 with 8 of 128 experts,
  about 82 distinct experts for 128 pairs under uniform routing; at batch 1 every pair's expert is distinct), with no
  sort or align launch before: a program finds which tokens share its expert from the
  T * k expert ids (a few hundred bytes, from L2);
- a program owns BLOCK_N weight rows and walks K in [BLOCK_N, BLOCK_K] tiles loaded along K, the
  weight's contiguous axis, accumulating in fp32. With one token the tiles are multiplied by x
  element-wise and summed along K (no tensor cores, as the GEMV does at one row); with more,
  the tokens' rows are padded to a 16-row tile (a dot's least) and tensor cores sum them, the
  rows of tokens not routed to the expert masked out;
- gate_up: the program's rows are pairs (gate row f, up row f), so it forms silu(gate) * up
  itself and stores each routed token's row of the intermediate [T * k, I] (a row per pair);
- down: the program stores each routed token's rounded, weighted term (as the reference rounds
  it) into a [T * k, H] buffer, then bumps a counter per (token, N tile); the program that
  brings a token's counter to k (the last of its k experts to finish that tile) adds the token's
  k terms in expert-slot order, in fp32, stores the output tile and sets the counter back to
  zero. One launch, no separate reduction, and the same sum whatever order the programs run in:
  bitwise reproducible. The counters are shared by every call on a device, so calls must not run
  concurrently on two streams.
At one token the down projection takes a kernel of its own: a program owns BLOCK_N output rows of
all k experts ([k, BLOCK_N, BLOCK_K] tiles, k loads in flight) and sums the k terms itself, in
the same slot order, with no terms buffer and no counters.

There are k * cdiv(N, BLOCK_N) programs at batch 1 (8 * 192 for Qwen3-30B-A3B's gate_up in
8-row tiles), several per SM on any Qwen MoE shape, so K is never split: a split would also sum
a term before it is complete, where the reference rounds each term whole.

fp8 experts (the WFMT constexpr; 16-bit experts compile as before) are read as stored and
dequantized in registers, x staying in its dtype, as ops/quant's GEMV does for a dense layer: at
one token each tile's fp32 products are summed per 128-column segment (SEG = min(BLOCK_K, the
block's width)) and each segment's sum multiplied by its block scale; with tensor cores the fp8
tile is converted to x's dtype (exact) and the dot's result multiplied by the tile's block scale
(the K tile held to one block); a channel scale multiplies each row's sum after the K loop. The
gate and up rows of w13 each read their own block rows of w13_scale.

int4 experts (WFMT 3: ops/quant's int4 layout, AWQ / GPTQ in plain column order) are read as
words, K walked in tiles of up to one run (S words, 16 at Qwen3-30B-A3B's shapes): nibble j of
a tile's words is a run of consecutive columns in one group, dequantized by shift and mask into
the exact integers q - z (fp32 at one token, multiplied by x's run element-wise; x's dtype with
more, a dot with x's run), and the sums of a group's runs multiplied by its scale once. (A plain
shift-and-mask path: ops/quant/triton_int4.py's PTX dequantization and tiles are not used here.)

With PDL (ops/triton_utils.py) a kernel starts as the previous one drains, but waits for it
before any load: which weights to read depends on the expert ids the routing kernel writes.
No host sync and no data-dependent shape, so both launches can be captured in a CUDA graph.
Tile sizes come from hotpath.ops.moe.tuning (tuned JSON files, else a fixed rule).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.moe import tuning
from hotpath.ops.moe.triton_common import (
    W16,
    W16_FORMAT,
    ExpertFormat,
    block_segments,
    expert_formats,
    int4_operand,
    int4_run,
    scale_rows,
    silu_and_mul_rounded,
    weighted_term,
)
from hotpath.ops.moe.triton_grouped import check_kernel_args
from hotpath.ops.quant.reference import BlockSize
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    zeroed_counters,
)

# the most tokens the decode kernels take: every token's row fits one 16-row dot tile
MAX_TOKENS = 16
# one counter per (token, N tile) of the down projection
MAX_COUNTERS = 1 << 16


@triton.jit
def _routed_tokens(ids_ptr, p, T, top_k, BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr):
    """Pair p's expert, whether p is the first pair routed to it, and for each token t (a
    [BLOCK_T] vector): whether it is routed to that expert, and through which pair."""
    expert = tl.load(ids_ptr + p)
    rt = tl.arange(0, BLOCK_T)
    rj = tl.arange(0, BLOCK_J)
    q = rt[:, None] * top_k + rj[None, :]  # [BLOCK_T, BLOCK_J] pair numbers
    ids = tl.load(ids_ptr + q, mask=(rt < T)[:, None] & (rj < top_k)[None, :], other=-1)
    match = ids == expert
    first = tl.min(tl.min(tl.where(match, q, T * top_k), axis=1), axis=0)
    hit = tl.max(match.to(tl.int32), axis=1) > 0
    pair = tl.sum(tl.where(match, q, 0), axis=1)  # a token's experts are distinct: one match
    return expert.to(tl.int64), first == p, hit, pair


@triton.jit
def _rows_times_tokens(w_rows, s_rows, z_rows, x_rows, x_ok, K, WFMT: tl.constexpr, GROUP_K: tl.constexpr,
                       SLICE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                       EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """[BLOCK_N, BLOCK_T] fp32: the weight rows at w_rows ([BLOCK_N, 1] pointers) times the token
    rows at x_rows ([BLOCK_T, 1] pointers; those where x_ok is false read as 0), over K. fp8 block
    weights: each segment's sum times its scale (s_rows, see scale_rows; a dot's tile lies within
    one block); fp8 per channel: without the scale, which the caller applies. int4: see
    _int4_rows_times_tokens."""
    if WFMT == 3:
        return _int4_rows_times_tokens(w_rows, s_rows, z_rows, x_rows, x_ok, K, GROUP_K, SLICE, BLOCK_T,
                                       BLOCK_K, DOT_PRECISION)
    rk = tl.arange(0, BLOCK_K)
    if BLOCK_T == 1:
        acc = tl.zeros([w_rows.shape[0]], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            if EVEN_K:
                w = tl.load(w_rows + kk[None, :])
                x = tl.load(x_rows + kk[None, :])
            else:
                w = tl.load(w_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
                x = tl.load(x_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
            p = w.to(tl.float32) * x.to(tl.float32)
            if WFMT == 2:
                SEG: tl.constexpr = min(BLOCK_K, GROUP_K)
                p = tl.sum(tl.reshape(p, (w_rows.shape[0], BLOCK_K // SEG, SEG)), axis=2)
                p = p * block_segments(s_rows, k0, K, BLOCK_K, GROUP_K)
            acc += tl.sum(p, axis=1)
        return acc[:, None]
    acc = tl.zeros([w_rows.shape[0], BLOCK_T], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            w = tl.load(w_rows + kk[None, :])
            x = tl.load(x_rows + kk[None, :], mask=x_ok[:, None], other=0.0)
        else:
            w = tl.load(w_rows + kk[None, :], mask=(kk < K)[None, :], other=0.0)
            x = tl.load(x_rows + kk[None, :], mask=x_ok[:, None] & (kk < K)[None, :], other=0.0)
        if WFMT == 0:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
        elif WFMT == 1:
            # fp8 values are exact in any 16-bit float: the dot is the dequantized weight's
            acc = tl.dot(w.to(x.dtype), tl.trans(x), acc, input_precision=DOT_PRECISION)
        else:
            s = tl.load(s_rows + k0 // GROUP_K)  # [BLOCK_N, 1]
            acc += tl.dot(w.to(x.dtype), tl.trans(x), input_precision=DOT_PRECISION) * s
    return acc


@triton.jit
def _int4_rows_times_tokens(w_rows, s_rows, z_rows, x_rows, x_ok, K, GROUP_K: tl.constexpr,
                            SLICE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                            DOT_PRECISION: tl.constexpr):
    """_rows_times_tokens on int4 rows (w_rows [BLOCK_N, 1] pointers to their words, s_rows and
    z_rows to their groups' scales and zero points): K walked in tiles of BLOCK_K / 8 words,
    nibble nib of a tile being a run of consecutive columns in one group (triton_common.int4_run).
    Each run's operand is the exact q - z (fp32 for one token's element-wise sums, x's dtype for a
    dot), its products with x's run summed, and the sums of a group's runs multiplied by its
    scale once."""
    BLOCK_W: tl.constexpr = BLOCK_K // 8
    RUNS: tl.constexpr = min(8, GROUP_K // SLICE)  # consecutive runs of one group
    rw = tl.arange(0, BLOCK_W)
    acc = tl.zeros([w_rows.shape[0], BLOCK_T], dtype=tl.float32)
    for u0 in range(0, K // 8, BLOCK_W):
        words = tl.load(w_rows + (u0 + rw)[None, :])  # [BLOCK_N, BLOCK_W]
        part = tl.zeros([w_rows.shape[0], BLOCK_T], dtype=tl.float32)
        for nib in tl.static_range(8):
            c0 = int4_run(u0, nib, SLICE)
            g = c0 // GROUP_K
            q = int4_operand(words, nib, tl.load(z_rows + g).to(tl.int32))
            x = tl.load(x_rows + (c0 + rw)[None, :], mask=x_ok[:, None], other=0.0)  # [BLOCK_T, BLOCK_W]
            if BLOCK_T == 1:
                part += tl.sum(q.to(tl.float32) * x.to(tl.float32), axis=1, keep_dims=True)
            else:
                part = tl.dot(q.to(x.dtype), tl.trans(x), part, input_precision=DOT_PRECISION)
            if nib % RUNS == RUNS - 1:
                acc += part * tl.load(s_rows + g).to(tl.float32)
                part = tl.zeros([w_rows.shape[0], BLOCK_T], dtype=tl.float32)
    return acc


@triton.jit(do_not_specialize=["T"])
def _decode_gate_up_kernel(
    x_ptr,  # [T, H]
    w_ptr,  # [E, 2 * I, H] (int4: words [E, 2 * I, H / 8]), H contiguous: gate rows then up rows
    scale_ptr,  # fp8: [E, 2 * I] (channel), [E, 2 * I blocks, H blocks] (block); int4: [E, 2 * I, H / G]
    zero_ptr,  # int4: uint8 [E, 2 * I, H / G]
    ids_ptr,  # [T * top_k] int32
    out_ptr,  # [T * top_k, I]: silu(gate) * up of each pair
    T,
    I,
    H,
    top_k,
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_ot,
    WFMT: tl.constexpr,  # W16, FP8_CHANNEL, FP8_BLOCK, INT4 (triton_common)
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    SLICE: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, first, hit, pair = _routed_tokens(ids_ptr, p, T, top_k, BLOCK_T, BLOCK_J)
    if not first:
        return
    # rows in pairs: row 2f is gate row f, row 2f + 1 up row f (past I: row I - 1, not stored)
    rv = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    f, half = tl.minimum(rv // 2, I - 1), rv % 2
    w_row = f + half * I
    w_rows = w_ptr + expert * stride_we + w_row.to(tl.int64)[:, None] * stride_wn
    s_rows = scale_rows(scale_ptr, expert, f, half, I, stride_se, stride_sn, WFMT, GROUP_N)
    z_rows = scale_rows(zero_ptr, expert, f, half, I, stride_se, stride_sn, WFMT, GROUP_N)
    x_rows = x_ptr + tl.arange(0, BLOCK_T).to(tl.int64)[:, None] * stride_xt
    acc = _rows_times_tokens(w_rows, s_rows[:, None], z_rows[:, None], x_rows, hit, H, WFMT, GROUP_K, SLICE,
                             BLOCK_T, BLOCK_K, EVEN_K, DOT_PRECISION)
    if WFMT == 1:
        acc = acc * tl.load(s_rows)[:, None]
    gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N // 2, 2, BLOCK_T)), (0, 2, 1)))
    h = silu_and_mul_rounded(gate, up, out_ptr.dtype.element_ty)  # [BLOCK_N // 2, BLOCK_T]
    rf = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(out_ptr + pair.to(tl.int64)[None, :] * stride_ot + rf[:, None], h,
             mask=(rf < I)[:, None] & hit[None, :])


@triton.jit(do_not_specialize=["T"])
def _decode_down_kernel(
    h_ptr,  # [T * top_k, I]: the gate_up kernel's output
    w_ptr,  # [E, H, I] (int4: words [E, H, I / 8]), I contiguous
    scale_ptr,  # fp8: [E, H] (channel), [E, H blocks, I blocks] (block); int4: [E, H, I / G]
    zero_ptr,  # int4: uint8 [E, H, I / G]
    ids_ptr,  # [T * top_k] int32
    weights_ptr,  # [T * top_k] fp32
    terms_ptr,  # [T * top_k, H]: each pair's weighted output, rounded as the reference's
    counter_ptr,  # [T * n_tiles] int32, zero between calls
    out_ptr,  # [T, H]
    T,
    H,
    I,
    top_k,
    stride_ht,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_tt,
    stride_ot,
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    SLICE: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert, first, hit, pair = _routed_tokens(ids_ptr, p, T, top_k, BLOCK_T, BLOCK_J)
    if not first:
        return
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_row = tl.minimum(rn, H - 1)
    w_rows = w_ptr + expert * stride_we + w_row.to(tl.int64)[:, None] * stride_wn
    s_rows = scale_rows(scale_ptr, expert, w_row, 0, H, stride_se, stride_sn, WFMT, GROUP_N)
    z_rows = scale_rows(zero_ptr, expert, w_row, 0, H, stride_se, stride_sn, WFMT, GROUP_N)
    h_rows = h_ptr + pair.to(tl.int64)[:, None] * stride_ht
    acc = _rows_times_tokens(w_rows, s_rows[:, None], z_rows[:, None], h_rows, hit, I, WFMT, GROUP_K, SLICE,
                             BLOCK_T, BLOCK_K, EVEN_K, DOT_PRECISION)
    if WFMT == 1:
        acc = acc * tl.load(s_rows)[:, None]
    weight = tl.load(weights_ptr + pair, mask=hit, other=0.0)
    dtype = terms_ptr.dtype.element_ty
    term = weighted_term(acc, weight[None, :], dtype)  # [BLOCK_N, BLOCK_T]
    n_ok = (rn < H)[:, None]
    tl.store(terms_ptr + pair.to(tl.int64)[None, :] * stride_tt + rn[:, None], term.to(dtype),
             mask=n_ok & hit[None, :])
    # every thread's terms are stored before the (acq_rel) counters publish them
    tl.debug_barrier()
    rt = tl.arange(0, BLOCK_T)
    counters = counter_ptr + rt * tl.num_programs(1) + pid_n
    arrived = tl.atomic_add(counters, 1, mask=hit, sem="acq_rel", scope="gpu")
    last = hit & (arrived == top_k - 1)  # [BLOCK_T]: tokens whose k terms of this tile are all in
    if tl.max(last.to(tl.int32), axis=0) > 0:
        total = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for j in range(top_k):
            rows = (rt * top_k + j).to(tl.int64)
            # .cg: from L2, where the other programs' stores are, not from this SM's L1
            total += tl.load(terms_ptr + rows[None, :] * stride_tt + rn[:, None],
                             mask=n_ok & last[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + rt.to(tl.int64)[None, :] * stride_ot + rn[:, None],
                 total.to(out_ptr.dtype.element_ty), mask=n_ok & last[None, :])
        tl.store(counters, 0, mask=last)


@triton.jit
def _decode_down_one_token_kernel(
    h_ptr,  # [top_k, I]: the gate_up kernel's output for one token
    w_ptr,  # [E, H, I] (int4: words [E, H, I / 8]), I contiguous
    scale_ptr,  # fp8: [E, H] (channel), [E, H blocks, I blocks] (block); int4: [E, H, I / G]
    zero_ptr,  # int4: uint8 [E, H, I / G]
    ids_ptr,  # [top_k] int32
    weights_ptr,  # [top_k] fp32
    out_ptr,  # [1, H]
    H,
    I,
    top_k,
    stride_ht,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    SLICE: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One token: a program owns BLOCK_N output rows and reads them from all k experts at once
    ([BLOCK_J, BLOCK_N, BLOCK_K] tiles: k loads in flight, not one), then sums the k rounded
    terms in expert-slot order itself: no terms buffer, no counters."""
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    pid_n = tl.program_id(0)
    rj = tl.arange(0, BLOCK_J)
    j_ok = rj < top_k
    experts = tl.load(ids_ptr + rj, mask=j_ok, other=0).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, H - 1).to(tl.int64)
    w_rows = w_ptr + experts[:, None, None] * stride_we + rows[None, :, None] * stride_wn  # [J, N, 1]
    s_rows = scale_rows(scale_ptr, experts[:, None], rows[None, :], 0, H, stride_se, stride_sn, WFMT,
                        GROUP_N)  # [J, N]
    h_rows = h_ptr + rj.to(tl.int64)[:, None] * stride_ht  # [J, 1]
    acc = tl.zeros([BLOCK_J, BLOCK_N], dtype=tl.float32)
    if WFMT == 3:
        # int4: as _int4_rows_times_tokens at one token, for all k experts' rows at once
        z_rows = scale_rows(zero_ptr, experts[:, None], rows[None, :], 0, H, stride_se, stride_sn, WFMT,
                            GROUP_N)  # [J, N]
        BLOCK_W: tl.constexpr = BLOCK_K // 8
        RUNS: tl.constexpr = min(8, GROUP_K // SLICE)
        rw = tl.arange(0, BLOCK_W)
        for u0 in range(0, I // 8, BLOCK_W):
            words = tl.load(w_rows + (u0 + rw)[None, None, :], mask=j_ok[:, None, None], other=0)
            part = tl.zeros([BLOCK_J, BLOCK_N], dtype=tl.float32)
            for nib in tl.static_range(8):
                c0 = int4_run(u0, nib, SLICE)
                g = c0 // GROUP_K
                z = tl.load(z_rows + g, mask=j_ok[:, None], other=0).to(tl.int32)
                q = int4_operand(words, nib, z[:, :, None])  # [J, N, W]
                h = tl.load(h_rows + (c0 + rw)[None, :], mask=j_ok[:, None], other=0.0)  # [J, W]
                part += tl.sum(q.to(tl.float32) * h.to(tl.float32)[:, None, :], axis=2)
                if nib % RUNS == RUNS - 1:
                    acc += part * tl.load(s_rows + g, mask=j_ok[:, None], other=0.0).to(tl.float32)
                    part = tl.zeros([BLOCK_J, BLOCK_N], dtype=tl.float32)
    else:
        rk = tl.arange(0, BLOCK_K)
        for k0 in range(0, I, BLOCK_K):
            kk = k0 + rk
            if EVEN_K:
                k_ok = j_ok[:, None]
            else:
                k_ok = j_ok[:, None] & (kk < I)[None, :]
            w = tl.load(w_rows + kk[None, None, :], mask=k_ok[:, None, :], other=0.0)
            h = tl.load(h_rows + kk[None, :], mask=k_ok, other=0.0)
            p = w.to(tl.float32) * h.to(tl.float32)[:, None, :]
            if WFMT == 2:
                SEG: tl.constexpr = min(BLOCK_K, GROUP_K)
                p = tl.sum(tl.reshape(p, (BLOCK_J, BLOCK_N, BLOCK_K // SEG, SEG)), axis=3)
                p = p * block_segments(s_rows[:, :, None], k0, I, BLOCK_K, GROUP_K)
            acc += tl.sum(p, axis=2)
    if WFMT == 1:
        acc = acc * tl.load(s_rows, mask=j_ok[:, None], other=0.0)
    weight = tl.load(weights_ptr + rj, mask=j_ok, other=0.0)
    dtype = out_ptr.dtype.element_ty
    terms = weighted_term(acc, weight[:, None], dtype)  # [BLOCK_J, BLOCK_N]
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(top_k):  # in slot order, as the k-token kernel sums
        total += tl.sum(tl.where(rj[:, None] == j, terms, 0.0), axis=0)
    tl.store(out_ptr + rn, total.to(dtype), mask=rn < H)


def fused_moe(
    x: torch.Tensor,  # [T, H], T <= MAX_TOKENS
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] fp32
    topk_ids: torch.Tensor,  # [T, k] int32, distinct within a row
    gate_up_config: tuning.DecodeConfig | None = None,
    down_config: tuning.DecodeConfig | None = None,
    *,
    w13_scale: torch.Tensor | None = None,  # fp8 and int4 experts (see reference.check_moe_args)
    w2_scale: torch.Tensor | None = None,
    block_size: BlockSize | None = None,
    w13_zeros: torch.Tensor | None = None,  # int4 experts
    w2_zeros: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:  # [T, H] in x's dtype
    """See the module docstring; the configs override the tuned / default ones (the tuner and
    tests sweep them)."""
    quant = (w13_scale, w2_scale, block_size, w13_zeros, w2_zeros, group_size)
    check_kernel_args(x, w13, w2, topk_weights, topk_ids, *quant)
    T, H = x.shape
    E, I = w13.shape[0], w13.shape[1] // 2
    if T > MAX_TOKENS:
        raise ValueError(f"the decode kernels take at most {MAX_TOKENS} tokens, got {T}")
    if T == 0:
        return torch.zeros_like(x)
    ids = topk_ids.to(torch.int32).contiguous().view(-1)  # [T * k]
    weights = topk_weights.to(torch.float32).contiguous().view(-1)  # [T * k]
    top_k = topk_ids.shape[1]
    fmt13, fmt2 = expert_formats(w13, *quant)
    # fp8 and int4 experts' tiles are looked up under the weights' dtype (int4: int32, the words'),
    # a file of their own if tuned
    dtype = w13.dtype if fmt13.wfmt != W16 else x.dtype
    h = gate_up(x, w13, ids, top_k, gate_up_config or tuning.decode_config(T, E, 2 * I, H, dtype, x.device),
                fmt13)
    return down(h, w2, ids, weights, top_k,
                down_config or tuning.decode_config(T, E, H, I, dtype, x.device, top_k=top_k), fmt2)


def gate_up(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    ids: torch.Tensor,  # [T * k] int32
    top_k: int,
    cfg: tuning.DecodeConfig,
    fmt: ExpertFormat = W16_FORMAT,
) -> torch.Tensor:  # [T * k, I]: silu(gate) * up of each (token, expert) pair
    T, H = x.shape
    I = w13.shape[1] // 2
    out = torch.empty((T * top_k, I), dtype=x.dtype, device=x.device)
    scale, zeros, stride_se, stride_sn = fmt.args(w13)
    _decode_gate_up_kernel[(T * top_k, triton.cdiv(2 * I, cfg.block_n))](
        x, w13, scale, zeros, ids, out, T, I, H, top_k, x.stride(0), w13.stride(0), w13.stride(1), stride_se,
        stride_sn, out.stride(0), **fmt.constexprs(), **_launch_options(T, top_k, H, cfg, x, fmt),
    )
    return out


def down(
    h: torch.Tensor,  # [T * k, I], from gate_up
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T * k] int32
    weights: torch.Tensor,  # [T * k] fp32
    top_k: int,
    cfg: tuning.DecodeConfig,
    fmt: ExpertFormat = W16_FORMAT,
) -> torch.Tensor:  # [T, H]: each token's weighted sum over its experts
    T, I = h.shape[0] // top_k, h.shape[1]
    H = w2.shape[1]
    out = torch.empty((T, H), dtype=h.dtype, device=h.device)
    options = _launch_options(T, top_k, I, cfg, h, fmt) | fmt.constexprs()
    scale, zeros, stride_se, stride_sn = fmt.args(w2)
    if T == 1:
        del options["BLOCK_T"], options["DOT_PRECISION"]
        _decode_down_one_token_kernel[(triton.cdiv(H, cfg.block_n),)](
            h, w2, scale, zeros, ids, weights, out, H, I, top_k, h.stride(0), w2.stride(0), w2.stride(1),
            stride_se, stride_sn, **options)
        return out
    n_tiles = triton.cdiv(H, cfg.block_n)
    if T * n_tiles > MAX_COUNTERS:
        raise ValueError(f"the down kernel keeps at most {MAX_COUNTERS} (token, N tile) counters; "
                         f"{T} tokens x {n_tiles} tiles need more")
    terms = torch.empty((T * top_k, H), dtype=h.dtype, device=h.device)  # [T * k, H]
    _decode_down_kernel[(T * top_k, n_tiles)](
        h, w2, scale, zeros, ids, weights, terms, zeroed_counters("moe decode down", MAX_COUNTERS, h.device), out,
        T, H, I, top_k, h.stride(0), w2.stride(0), w2.stride(1), stride_se, stride_sn, terms.stride(0),
        out.stride(0), **options,
    )
    return out


def _launch_options(T: int, top_k: int, K: int, cfg: tuning.DecodeConfig, x: torch.Tensor,
                    fmt: ExpertFormat) -> dict:
    """The constexprs and launch options both kernels take, for T tokens and a K-long weight."""
    block_t = 1 if T == 1 else MAX_TOKENS
    if cfg.block_n % 2 or (block_t > 1 and cfg.block_n < 16):
        raise ValueError(f"block_n must be even (gate_up pairs its rows), and at least 16 for more "
                         f"than one token (a dot's least), got {cfg.block_n}")
    block_k = fmt.tile_k(cfg.block_k, dots=block_t > 1)
    use_pdl = pdl_enabled(x.device)
    return dict(
        EVEN_K=K % block_k == 0,
        USE_PDL=use_pdl,
        BLOCK_T=block_t,
        # at least 4: Triton once summed a size-2 axis wrongly on the GPU (docs/decisions.md, MoE)
        BLOCK_J=max(4, triton.next_power_of_2(top_k)),
        BLOCK_N=cfg.block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )
