"""Fused MoE for many tokens (prefill, large batches): the (token, expert) pairs sorted by
expert, then one grouped GEMM launch per projection.

1. Align (two small launches, `align_by_expert`). The T * k pairs, numbered p = t * k + j (token
   t's j-th expert), are laid out by expert in `sorted_pairs`, each expert's span padded to a
   multiple of BLOCK_M with the sentinel T * k, so that every BLOCK_M tile of it belongs to one
   expert (`block_expert`). The count kernel adds each program's histogram of expert ids into
   per-expert counts; its last program to finish (an atomic arrival counter says which) turns
   them into padded spans, writes `num_padded` (where the used rows end) and sets the counts back
   to zero. The place kernel gives each pair the next free row of its expert's span (an atomic
   cursor per expert: the order of pairs within an expert varies from run to run, and nothing
   depends on it), and fills the padding rows and the tiles' experts. Buffer sizes are static
   upper bounds of T, k and E (the spans end by T * k + min(E, T * k) * (BLOCK_M - 1)): no host
   sync, no data-dependent shape, so the whole op can be captured in a CUDA graph. Tiles past
   num_padded exit at once. The counts and arrival counter are shared by every call on a
   device, so calls must not run concurrently on two streams.
2. gate_up: a program computes a [BLOCK_M, BLOCK_N] tile of one expert's rows: x's rows of the
   tile's pairs (gathered by token) times the expert's weight rows, the gate and up rows of each
   output interleaved in the tile, so that silu(gate) * up is formed in the epilogue and stored
   per pair into the intermediate [T * k, I].
3. down: the same GEMM over the intermediate's rows; the epilogue rounds each row as the
   reference does, multiplies it by the pair's routing weight and adds it with fp32 atomics into
   a [T, H] fp32 accumulator, which is the top-k sum (then one cast to the model dtype, unless
   that is fp32). The atomics make the sum's order, and so its last fp32 bit, vary from run to
   run (rarely the rounded bf16 value): the result is not bitwise reproducible, unlike the
   decode path's.
fp8 experts (the WFMT constexpr; 16-bit experts compile as before): weight-only dequantization in
the tile loop. Each fp8 weight tile is converted to x's dtype (exact: e4m3 values fit any 16-bit
float) and multiplied on tensor cores with x as it is; with block scales the K tile is held to
one block and each partial dot multiplied by its columns' block scales before it joins the fp32
accumulator; a channel scale multiplies the accumulator's columns in the epilogue. This is the
arithmetic of the decode kernels and of the reference (x not quantized), so every token count
rounds alike. (An fp8 x fp8 path, x quantized per token and group as ops/quant's GEMM does,
would halve the dot's operand bytes and double its rate where a large prefill is compute-bound;
left out: weight bytes, which this path already halves, are what decode and mid-size batches
wait on.) The block path holds each partial dot beside the accumulator, so it takes more
registers than the 16-bit path (benchmarks/tune_moe.py --fp8 block tries 8 warps too).
int4 experts (WFMT 3): a K tile is up to one run of S words (16 at Qwen3-30B-A3B's shapes), each
nibble's run of columns dequantized by shift and mask into the exact integers q - z in x's dtype
and multiplied on tensor cores with x's matching columns, the dots of one group chained and
multiplied by the group's scales before they join the accumulator (weight-only, as the decode
kernels and the reference: every token count rounds alike).
Tile sizes come from hotpath.ops.moe.tuning (tuned JSON files, else a fixed rule; fp8 experts
look theirs up under the weights' dtype).
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from hotpath.ops.moe import tuning
from hotpath.ops.moe.reference import check_moe_args
from hotpath.ops.moe.triton_common import (
    W16,
    W16_FORMAT,
    ExpertFormat,
    expert_formats,
    int4_operand,
    int4_run,
    scale_rows,
    silu_and_mul_rounded,
    weighted_term,
)
from hotpath.ops.quant.reference import BlockSize
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    tl_dtype,
    zeroed_counters,
)

# pairs a program of the align kernels takes, and tiles a place program labels
ALIGN_BLOCK = 1024
ALIGN_TILES = 32
# the align kernels' per-expert counts live in one zeroed buffer per device
MAX_EXPERTS = 1024


@triton.jit(do_not_specialize=["num_pairs"])
def _align_count_kernel(
    ids_ptr,  # [num_pairs] expert of each pair
    counts_ptr,  # [>= E] int32, zero between calls
    arrived_ptr,  # [1] int32, zero between calls
    span_end_ptr,  # [E] int32 out: where each expert's padded span ends
    fill_end_ptr,  # [E] int32 out: where its pairs end (padding from there to span_end)
    cursor_ptr,  # [E] int32 out: where its span starts (the place kernel's cursors)
    num_padded_ptr,  # [1] int32 out: the spans' total
    num_pairs,
    E,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    rp = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + rp, mask=rp < num_pairs, other=0)
    hist = tl.histogram(ids, BLOCK_E, mask=rp < num_pairs)
    re = tl.arange(0, BLOCK_E)
    tl.atomic_add(counts_ptr + re, hist, mask=(re < E) & (hist > 0), sem="relaxed")
    # every thread's adds are issued before the (acq_rel) arrival publishes them
    tl.debug_barrier()
    arrived = tl.atomic_add(arrived_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:
        # read at L2 (an atomic), then leave zero; a vector atomic_xchg does not compile for AMD
        # in Triton 3.6
        counts = tl.atomic_add(counts_ptr + re, 0, mask=re < E, sem="relaxed")
        tl.store(counts_ptr + re, 0, mask=re < E)
        counts = tl.where(re < E, counts, 0)
        padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        span_end = tl.cumsum(padded, axis=0)
        start = span_end - padded
        tl.store(span_end_ptr + re, span_end, mask=re < E)
        tl.store(fill_end_ptr + re, start + counts, mask=re < E)
        tl.store(cursor_ptr + re, start, mask=re < E)
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))
        tl.store(arrived_ptr, 0)


@triton.jit(do_not_specialize=["num_pairs", "num_tiles"])
def _align_place_kernel(
    ids_ptr,  # [num_pairs]
    span_end_ptr,  # [E], from the count kernel
    fill_end_ptr,  # [E]
    cursor_ptr,  # [E], advanced here
    sorted_pairs_ptr,  # [num_tiles * BLOCK_M] int32 out
    block_expert_ptr,  # [num_tiles] int32 out
    num_pairs,
    num_tiles,
    E,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_E: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    pid = tl.program_id(0)
    # this program's pairs, each into the next free row of its expert's span
    rp = pid * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + rp, mask=rp < num_pairs, other=0)
    row = tl.atomic_add(cursor_ptr + ids, 1, mask=rp < num_pairs, sem="relaxed")
    tl.store(sorted_pairs_ptr + row, rp, mask=rp < num_pairs)
    # this program's tiles: each one's expert (the spans ending at or before its first row; E
    # past the used rows), and the sentinel in its padding rows
    rb = pid * TILES + tl.arange(0, TILES)
    re = tl.arange(0, BLOCK_E)
    span_end = tl.load(span_end_ptr + re, mask=re < E, other=2147483647)
    expert = tl.sum((span_end[None, :] <= (rb * BLOCK_M)[:, None]).to(tl.int32), axis=1)  # [TILES]
    tl.store(block_expert_ptr + rb, expert, mask=rb < num_tiles)
    used = (rb < num_tiles) & (expert < E)
    fill_end = tl.load(fill_end_ptr + expert, mask=used, other=0)
    rows = rb[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]  # [TILES, BLOCK_M]
    tl.store(sorted_pairs_ptr + rows, num_pairs, mask=used[:, None] & (rows >= fill_end[:, None]))


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most BLOCK_M tiles the padded spans can take: each expert a pair is routed to pads at
    most BLOCK_M - 1 rows."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)


def align_by_expert(
    topk_ids: torch.Tensor,  # [T, k] int32
    num_experts: int,
    block_m: int,
    skip_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs p = t * k + j laid out by expert, padded per expert to multiples of block_m:
    (sorted_pairs [max_tiles * block_m] int32, the pair of each row or T * k in padding, valid
    up to num_padded; block_expert [max_tiles] int32, each tile's expert, E past num_padded;
    num_padded [1] int32). `skip_last`: the last expert is a bucket for pairs not to compute
    (expert parallelism's other ranks' pairs): num_padded ends where its span starts, so the
    GEMMs' tiles past it exit at once."""
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"the align kernels take at most {MAX_EXPERTS} experts, got {num_experts}")
    device = topk_ids.device
    ids = topk_ids.reshape(-1)  # [P]
    num_pairs = ids.numel()
    num_tiles = max_tiles(num_pairs, num_experts, block_m)
    sorted_pairs = torch.empty(num_tiles * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_tiles, dtype=torch.int32, device=device)
    spans = torch.empty((3, num_experts), dtype=torch.int32, device=device)  # span_end, fill_end, cursor
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    use_pdl = pdl_enabled(device)
    block_e = triton.next_power_of_2(num_experts)
    _align_count_kernel[(triton.cdiv(num_pairs, ALIGN_BLOCK),)](
        ids, zeroed_counters("moe align counts", MAX_EXPERTS, device),
        zeroed_counters("moe align arrivals", 1, device), spans[0], spans[1], spans[2], num_padded,
        num_pairs, num_experts,
        BLOCK_M=block_m, BLOCK=ALIGN_BLOCK, BLOCK_E=block_e, USE_PDL=use_pdl, num_warps=4,
        **pdl_launch(use_pdl),
    )
    grid = max(triton.cdiv(num_pairs, ALIGN_BLOCK), triton.cdiv(num_tiles, ALIGN_TILES))
    _align_place_kernel[(grid,)](
        ids, spans[0], spans[1], spans[2], sorted_pairs, block_expert, num_pairs, num_tiles,
        num_experts,
        BLOCK_M=block_m, BLOCK=ALIGN_BLOCK, TILES=ALIGN_TILES, BLOCK_E=block_e, USE_PDL=use_pdl,
        num_warps=4, **pdl_launch(use_pdl),
    )
    if skip_last:
        num_padded = spans[0, num_experts - 2 : num_experts - 1]  # the last computed expert's span end
    return sorted_pairs, block_expert, num_padded


@triton.jit(do_not_specialize=["num_pairs", "num_tiles"])
def _grouped_gemm_kernel(
    a_ptr,  # GATED: x [T, K]; else the intermediate [num_pairs, K]
    w_ptr,  # [E, N, K] (int4: words [E, N, K / 8]), K contiguous (GATED: N = 2 * I, gate rows then up rows)
    scale_ptr,  # fp8: [E, N] (channel), [E, N blocks, K blocks] (block; GATED: gate's, then up's); int4: [E, N, K / G]
    zero_ptr,  # int4: uint8 [E, N, K / G]
    out_ptr,  # GATED: the intermediate [num_pairs, N / 2]; else the fp32 accumulator [T, N]
    weights_ptr,  # [num_pairs] fp32 routing weights (not GATED)
    sorted_pairs_ptr,  # [num_tiles * BLOCK_M] int32
    block_expert_ptr,  # [num_tiles] int32
    num_padded_ptr,  # [1] int32
    num_pairs,
    num_tiles,
    N,
    K,  # columns (int4: 8 a word)
    top_k,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_om,
    WFMT: tl.constexpr,  # W16, FP8_CHANNEL, FP8_BLOCK, INT4 (triton_common)
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    SLICE: tl.constexpr,
    GATED: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    # GROUP_M M tiles in a row take the same N tiles (an expert's weight tiles reused in L2)
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = pid // in_group * GROUP_M
    group_size = tl.minimum(num_tiles - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    valid = pairs < num_pairs
    if GATED:
        a_rows = pairs // top_k  # x's row: the pair's token
    else:
        a_rows = pairs
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if GATED:
        # column c of the tile: gate row c // 2 if c is even, else the matching up row
        rows = N // 2
        f, half = tl.minimum(rn // 2, rows - 1), rn % 2
    else:
        rows = N
        f, half = tl.minimum(rn, N - 1), 0  # past N: a real row, never stored
    w_row = f + half * rows
    s_cols = scale_rows(scale_ptr, expert, f, half, rows, stride_se, stride_sn, WFMT, GROUP_N)  # [BLOCK_N]
    dtype = a_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if WFMT == 3:
        # int4: a tile of BLOCK_K / 8 words; nibble nib's operand (q - z, exact in x's dtype) is
        # a run of consecutive columns in one group (triton_common.int4_run), its dot chained with
        # the other runs of the group, the group's scale multiplying their sum
        BLOCK_W: tl.constexpr = BLOCK_K // 8
        RUNS: tl.constexpr = min(8, GROUP_K // SLICE)
        z_cols = scale_rows(zero_ptr, expert, f, half, rows, stride_se, stride_sn, WFMT, GROUP_N)
        rw = tl.arange(0, BLOCK_W)
        a_rows_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am  # [BLOCK_M, 1]
        w_ptrs = w_ptr + expert * stride_we + w_row.to(tl.int64)[None, :] * stride_wn + rw[:, None]
        for u0 in range(0, K // 8, BLOCK_W):
            words = tl.load(w_ptrs + u0)  # [BLOCK_W, BLOCK_N]
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for nib in tl.static_range(8):
                c0 = int4_run(u0, nib, SLICE)
                g = c0 // GROUP_K
                q = int4_operand(words, nib, tl.load(z_cols + g).to(tl.int32)[None, :]).to(dtype)
                a = tl.load(a_rows_ptrs + (c0 + rw)[None, :], mask=valid[:, None], other=0.0)
                part = tl.dot(a, q, part, input_precision=DOT_PRECISION)
                if nib % RUNS == RUNS - 1:
                    acc += part * tl.load(s_cols + g).to(tl.float32)[None, :]
                    part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + rk[None, :]
        w_ptrs = w_ptr + expert * stride_we + w_row.to(tl.int64)[None, :] * stride_wn + rk[:, None]
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
                w = tl.load(w_ptrs)
            else:
                k_ok = k0 + rk < K
                a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            if WFMT == 0:
                acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
            elif WFMT == 1:
                # fp8 values are exact in any 16-bit float: the dot is the dequantized weight's
                acc = tl.dot(a, w.to(dtype), acc, input_precision=DOT_PRECISION)
            else:
                # the tile lies within one block along K: its scale multiplies the partial dot
                s = tl.load(s_cols + k0 // GROUP_K)  # [BLOCK_N]
                acc += tl.dot(a, w.to(dtype), input_precision=DOT_PRECISION) * s[None, :]
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
    if WFMT == 1:
        acc = acc * tl.load(s_cols)[None, :]
    if GATED:
        gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        h = silu_and_mul_rounded(gate, up, dtype)  # [BLOCK_M, BLOCK_N // 2]
        rf = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_om + rf[None, :], h,
                 mask=valid[:, None] & (rf < N // 2)[None, :])
    else:
        weight = tl.load(weights_ptr + pairs, mask=valid, other=0.0)
        term = weighted_term(acc, weight[:, None], dtype)
        tokens = (pairs // top_k).to(tl.int64)
        tl.atomic_add(out_ptr + tokens[:, None] * stride_om + rn[None, :], term,
                      mask=valid[:, None] & (rn < N)[None, :], sem="relaxed")


def grouped_gemm(
    a: torch.Tensor,  # gated: x [T, K]; else the intermediate [T * k, K]
    w: torch.Tensor,  # [E, N, K]
    out: torch.Tensor,  # gated: the intermediate [T * k, N / 2]; else a zeroed fp32 [T, N]
    weights: torch.Tensor,  # [T * k] fp32 routing weights (used when not gated)
    aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # align_by_expert(.., cfg.block_m)
    num_pairs: int,
    top_k: int,
    gated: bool,
    cfg: tuning.GroupedConfig,
    fmt: ExpertFormat = W16_FORMAT,
) -> None:
    """One grouped GEMM launch: gate_up with silu-and-mul (gated), or down with the weighted
    top-k sum added into `out`. fp8 block weights hold cfg's K tile to one scale block; int4
    weights to one run of SLICE words (ExpertFormat.tile_k)."""
    if gated and cfg.block_n % 2:
        raise ValueError(f"gate_up tiles hold gate and up rows in pairs: block_n must be even, got {cfg.block_n}")
    sorted_pairs, block_expert, num_padded = aligned
    N, K = w.shape[1], a.shape[1]
    num_tiles = block_expert.numel()
    use_pdl = pdl_enabled(a.device)
    grid = (num_tiles * triton.cdiv(N, cfg.block_n),)
    block_k = fmt.tile_k(cfg.block_k, dots=True)
    scale, zeros, stride_se, stride_sn = fmt.args(w)
    _grouped_gemm_kernel[grid](
        a, w, scale, zeros, out, weights, sorted_pairs, block_expert, num_padded, num_pairs, num_tiles, N, K,
        top_k, a.stride(0), w.stride(0), w.stride(1), stride_se, stride_sn, out.stride(0),
        **fmt.constexprs(),
        GATED=gated,
        EVEN_K=K % block_k == 0,
        USE_PDL=use_pdl,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=block_k,
        GROUP_M=cfg.group_m,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )


def fused_moe(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] fp32
    topk_ids: torch.Tensor,  # [T, k] int32, distinct within a row
    gate_up_config: tuning.GroupedConfig | None = None,
    down_config: tuning.GroupedConfig | None = None,
    *,
    w13_scale: torch.Tensor | None = None,  # fp8 and int4 experts (see reference.check_moe_args)
    w2_scale: torch.Tensor | None = None,
    block_size: BlockSize | None = None,
    w13_zeros: torch.Tensor | None = None,  # int4 experts
    w2_zeros: torch.Tensor | None = None,
    group_size: int | None = None,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, H] in x's dtype
    """See the module docstring; the configs override the tuned / default ones (the tuner and
    tests sweep them). With `expert_map` (expert parallelism, reference.local_expert_ids) the
    pairs of other ranks' experts are aligned into a bucket after this rank's E experts, which
    no tile computes."""
    quant = (w13_scale, w2_scale, block_size, w13_zeros, w2_zeros, group_size)
    check_kernel_args(x, w13, w2, topk_weights, topk_ids, *quant, expert_map=expert_map)
    T, H = x.shape
    E, I = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    if T == 0:
        return torch.zeros_like(x)
    ids = topk_ids.to(torch.int32).contiguous()
    align = partial(align_by_expert, ids, E)
    if expert_map is not None:
        local = expert_map[topk_ids.long()]
        ids = torch.where(local >= 0, local, E).to(torch.int32)  # [T, k]: E is the bucket
        align = partial(align_by_expert, ids, E + 1, skip_last=True)
    weights = topk_weights.to(torch.float32).contiguous()
    fmt13, fmt2 = expert_formats(w13, *quant)
    # fp8 and int4 experts' tiles are looked up under the weights' dtype (int4: int32, the
    # words'), a file of their own if tuned
    dtype = w13.dtype if fmt13.wfmt != W16 else x.dtype
    gate_up_config = gate_up_config or tuning.grouped_config(T, top_k, E, 2 * I, H, dtype, x.device)
    down_config = down_config or tuning.grouped_config(T, top_k, E, H, I, dtype, x.device)
    aligned = align(gate_up_config.block_m)
    if down_config.block_m != gate_up_config.block_m:
        down_aligned = align(down_config.block_m)
    else:
        down_aligned = aligned
    intermediate = torch.empty((num_pairs, I), dtype=x.dtype, device=x.device)  # [T * k, I]
    grouped_gemm(x, w13, intermediate, weights, aligned, num_pairs, top_k, True, gate_up_config, fmt13)
    acc = torch.zeros((T, H), dtype=torch.float32, device=x.device)  # the top-k sum
    grouped_gemm(intermediate, w2, acc, weights, down_aligned, num_pairs, top_k, False, down_config, fmt2)
    return acc if x.dtype == torch.float32 else acc.to(x.dtype)


def check_kernel_args(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
                      w2_scale: torch.Tensor | None = None, block_size: BlockSize | None = None,
                      w13_zeros: torch.Tensor | None = None, w2_zeros: torch.Tensor | None = None,
                      group_size: int | None = None, expert_map: torch.Tensor | None = None) -> None:
    """The reference's checks, plus what the kernels need: a float dtype they take and rows
    contiguous along their last dimension."""
    check_moe_args(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_size, w13_zeros, w2_zeros,
                   group_size, expert_map)
    tl_dtype(x.dtype)  # raises for a dtype the kernels do not take
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("x and the expert weights must be contiguous along their last dimension")
