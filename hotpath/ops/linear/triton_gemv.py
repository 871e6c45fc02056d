"""Linear for a few rows (decode at batch 1..16): out = x @ weight^T (+ bias), x [M, K],
weight [N, K].

At small M a projection reads every weight element once and does 2 * M flops with it, so the kernel
is a stream over the weight, and its speed is how many weight bytes each SM keeps in flight. The
weight is spread over many programs:

- a program owns BLOCK_N output features (rows of the weight) and one split of K, and walks that
  split in [BLOCK_N, BLOCK_K] tiles read with wide loads along K, the weight's contiguous axis
  (or, at one row, holds all of K = BLOCK_K + TAIL_K as two tiles, so that no lane is masked);
- without tensor cores (USE_DOT off; the GEMV case, M = 1, and two rows on small weights, see
  hotpath.ops.linear.fma_rows) each tile is multiplied by x element-wise and summed along K into
  an fp32 [BLOCK_N] accumulator, a row of x at a time. Summing every tile (rather than once at
  the end) keeps the accumulator out of the registers, so more programs fit on an SM and more
  loads are in flight (Triton does not pipeline loads that feed no dot, so a program has one
  tile in flight). With tensor cores (more rows) the weight is the tall operand,
  acc[BLOCK_N, BLOCK_M] += w @ x^T, x's rows padded to BLOCK_M = 16, the least a dot takes, and
  Triton pipelines the tile loads through shared memory (num_stages);
- with programmatic dependent launch (ops/triton_utils.py) the kernel starts while the previous
  kernel finishes, and its first weight tile is already loading when it waits for that kernel's
  output: the ramp-up of the weight stream hides under the previous kernel's tail;
- the gated MLP's gate_up projection can run fused with SiLU-and-mul (GATED): a program's rows are
  pairs (gate row f, up row f), so it forms silu(gate) * up for its outputs itself, saving a launch
  and the [M, 2N] intermediate;
- the RMSNorms between projections fold in (see DecoderLayer.forward_few_rows): with a residual
  (linear_add_residual) the kernel adds its output into the residual stream in place and each N
  tile stores its rows' sum of squares of the new stream; with `rms` the next projection adds
  those partial sums (a few KB, read alongside x) in a fixed order, so every program gets the same
  statistic whatever the timing, and normalises x's tiles as it loads them. Summing in the
  consumer rather than in the producer's last tile keeps an atomic and a dependent read off the
  step's critical path;
- a weight with few rows and a long K gives too few programs, so K is split until there are
  several programs per SM (at one row only where K is longer than one tile: with K in one tile,
  the split's tail cost more in the decode graph than it gained). Each split writes an fp32
  partial sum; the last program of an N tile to finish (a counter per tile, bumped atomically, says
  which) adds the partials, adds the bias, writes the output and sets its counter back to zero. One
  launch does the whole op and a CUDA graph can replay it. The counters are shared by every call on
  a device, so calls must not run concurrently on two streams.

The tile sizes and the split come from `choose_config`, a fixed rule of the shape (nothing is tuned
at run time, so the op can be captured in a CUDA graph on its first call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops import linear as dispatch
from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    sm_count,
    zeroed_counters,
)

# x's rows padded to this for the tensor-core path (a dot's smallest dimension)
DOT_BLOCK_M = 16
# Split K until an op has about this many programs per SM (enough weight bytes in flight per SM
# for HBM's latency), but keep at least one BLOCK_K tile in every split.
PROGRAMS_PER_SM = 4
# At M = 1 one tile takes all of K up to this many elements (8 rows: 64 KB of bf16 a program)
WHOLE_K = 4096
# Rows the FMA path (USE_DOT off) unrolls at most; the dispatch gives it up to GEMV_FMA_MAX_ROWS
FMA_BLOCK_M = 4
# One counter per N tile of a split-K op; a split op never has more N tiles than this.
MAX_SPLIT_TILES = 4096


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # weight rows per program
    block_k: int  # K elements per tile
    split_k: int  # programs along K (1: no split)
    num_warps: int
    num_stages: int
    use_dot: bool  # tensor cores (x's rows padded to DOT_BLOCK_M) or element-wise FMAs
    # M = 1 without a split: a second tile of this many K elements (a power of 2) after the first
    # block_k, both loaded before PDL's wait, where K = block_k + tail_k is not a power of 2
    tail_k: int = 0


def _counters(device: torch.device) -> torch.Tensor:
    """The split-K counters, one per N tile of a split op."""
    return zeroed_counters("gemv split-K", MAX_SPLIT_TILES, device)


def split_for(n_tiles: int, K: int, block_k: int, device: torch.device,
              programs_per_sm: int = PROGRAMS_PER_SM) -> int:
    """How many programs along K give about `programs_per_sm` programs per SM; every split gets
    the same whole number of BLOCK_K tiles (but the last)."""
    if n_tiles > MAX_SPLIT_TILES:
        return 1
    chunks = triton.cdiv(K, block_k)
    split = min(chunks, max(1, triton.cdiv(programs_per_sm * sm_count(device), n_tiles)))
    return triton.cdiv(chunks, triton.cdiv(chunks, split))


def _tail_k(K: int) -> int:
    """K - WHOLE_K where that is a power of 2 up to WHOLE_K / 4 (K held whole as two tiles, 8 rows
    of bf16 in an 8-warp program's registers), else 0."""
    tail = K - WHOLE_K
    return tail if 0 < tail <= WHOLE_K // 4 and tail & (tail - 1) == 0 else 0


def choose_config(M: int, N: int, K: int, device: torch.device) -> GemvConfig:
    # Timed inside the decode graph, not back to back (docs/decisions.md, linear): one row holds its
    # whole share of K in one tile where K <= WHOLE_K (or WHOLE_K plus a small power-of-2 tail), so
    # it loads before PDL's wait; longer K walks tiles; two rows take half-height tiles.
    if dispatch.fma_rows(M, N, K):
        block_n, num_stages, use_dot = 8 if M == 1 else 4, 1, False
        if tail_k := _tail_k(K):
            return GemvConfig(block_n, WHOLE_K, 1, 8, num_stages, use_dot, tail_k)
        if K <= WHOLE_K:
            block_k = max(16, triton.next_power_of_2(K))
            if M == 1 and block_k == 2048 and 2 * triton.cdiv(N, 16) <= sm_count(device):
                # a short, 2048-wide weight in 16-row tiles on half the SMs or fewer: fewer,
                # taller programs finish the chain sooner
                return GemvConfig(16, block_k, 1, 8, num_stages, use_dot)
            few = triton.cdiv(N, block_n) <= PROGRAMS_PER_SM * sm_count(device)
            num_warps = 8 if block_k >= 2048 or few else 4
            return GemvConfig(block_n, block_k, 1, num_warps, num_stages, use_dot)
        if K % WHOLE_K == 0 and triton.cdiv(N, block_n) >= sm_count(device):
            return GemvConfig(block_n, WHOLE_K, 1, 8, num_stages, use_dot)
        block_k, num_warps = 1024, 4
        if N <= 2048 or split_for(triton.cdiv(N, block_n), K, 2048, device) == 1:
            block_k, num_warps = 2048, 8
    else:
        block_n, block_k, num_warps, num_stages, use_dot = 32, 256, 4, 3, True
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    split = split_for(triton.cdiv(N, block_n), K, block_k, device)
    return GemvConfig(block_n, block_k, split, num_warps, num_stages, use_dot)


@triton.jit
def _store_out(out_ptr, bias_ptr, acc, pid_n, rm, N, M, stride_om, stat_ptr,
               HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
               ROUND_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc: [BLOCK_N, BLOCK_M] fp32 sums of this program's (virtual) rows -> out[rm, features]."""
    dtype = out_ptr.dtype.element_ty
    if GATED:
        # rounded to the output dtype first, as the reference rounds the gate_up projection,
        # then silu(gate) rounded again before the product (torch's silu(gate) * up)
        gu = acc.to(dtype).to(tl.float32)
        gate, up = tl.split(tl.permute(tl.reshape(gu, (BLOCK_N // 2, 2, acc.shape[1])), (0, 2, 1)))
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = silu * up  # [BLOCK_N // 2, BLOCK_M]
        rn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    else:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
    mask = (rn < N)[:, None] & (rm < M)[None, :]
    out_ptrs = out_ptr + rm[None, :] * stride_om + rn[:, None]
    if RESIDUAL:
        # out is the residual stream: the projection (rounded as the reference rounds it) is
        # added to it in place, and this tile's share of the next RMSNorm's statistic, the sum of
        # squares of its part of the new stream, is stored for the next projection to add up
        h = (acc.to(dtype).to(tl.float32) + tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)).to(dtype)
        tl.store(out_ptrs, h, mask=mask)
        hf = tl.where(mask, h.to(tl.float32), 0.0)  # rows past N hold row N - 1's sums
        tl.store(stat_ptr + pid_n * M + rm, tl.sum(hf * hf, axis=0), mask=rm < M)
    else:
        # rounded to the input dtype even into a wider output (fp32 logits of a bf16 model), so
        # the values are those of the reference's projection, converted
        tl.store(out_ptrs, acc.to(ROUND_DTYPE).to(dtype), mask=mask)


@triton.jit
def _rstd(stat_ptr, n_stat, rm, M, K, eps, BLOCK_T: tl.constexpr):
    """[BLOCK_M] fp32 1 / RMS of x's rows rm, from the partial sums of squares stat [n_stat, M]
    a residual epilogue left: added in a fixed order, so every program gets the same value."""
    total = tl.zeros([BLOCK_T, rm.shape[0]], dtype=tl.float32)
    for t0 in range(0, n_stat, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        total += tl.load(stat_ptr + t[:, None] * M + rm[None, :],
                         mask=(t < n_stat)[:, None] & (rm < M)[None, :], other=0.0)
    return tl.rsqrt(tl.sum(total, axis=0) / K + eps)


@triton.jit
def _normed_x(x, rk, norm_w_ptr, rstd, K, EVEN_K: tl.constexpr):
    """RMSNorm applied to a tile of the un-normalised input, rounding as the reference does:
    x [.., BLOCK_K] in the input dtype, rstd broadcastable to it -> the same dtype."""
    if EVEN_K:
        w = tl.load(norm_w_ptr + rk)
    else:
        w = tl.load(norm_w_ptr + rk, mask=rk < K, other=0.0)
    normed = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
    return (normed * w.to(tl.float32)).to(x.dtype)


@triton.jit
def _w_tile(w_rows, rk, K, EVEN_K: tl.constexpr, EVICT: tl.constexpr):
    """The weight's [BLOCK_N, BLOCK_K] tile at columns rk of the rows w_rows ([BLOCK_N, 1]);
    EVICT: the loads' eviction policy (L1 and L2)."""
    if EVEN_K:
        return tl.load(w_rows + rk[None, :], eviction_policy=EVICT)
    return tl.load(w_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0, eviction_policy=EVICT)


@triton.jit
def _dot_row(w, x_row, rk, K, norm_w_ptr, rstd, EVEN_K: tl.constexpr, NORM_INPUT: tl.constexpr):
    """[BLOCK_N] fp32: the tile w [BLOCK_N, BLOCK_K] times the row x_row's entries rk, summed
    along K; rstd: the row's 1 / RMS (NORM_INPUT)."""
    if EVEN_K:
        x = tl.load(x_row + rk)
    else:
        x = tl.load(x_row + rk, mask=rk < K, other=0.0)
    if NORM_INPUT:
        x = _normed_x(x, rk, norm_w_ptr, rstd, K, EVEN_K)
    return tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)


@triton.jit
def _dot_rows(w, x_ptr, stride_xm, M, rk, K, norm_w_ptr, rstd, EVEN_K: tl.constexpr,
              NORM_INPUT: tl.constexpr, BLOCK_M: tl.constexpr):
    """[BLOCK_N, BLOCK_M] fp32 ([BLOCK_N] at one row): _dot_row for each of x's rows, with FMAs
    (no tensor cores). rstd [BLOCK_M]: each row's 1 / RMS (NORM_INPUT)."""
    if BLOCK_M == 1:
        # [BLOCK_N]: the caller's sum over K stays one-dimensional (a 2-D one takes more registers)
        acc = _dot_row(w, x_ptr, rk, K, norm_w_ptr, tl.sum(rstd) if NORM_INPUT else rstd, EVEN_K,
                       NORM_INPUT)
    else:
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([w.shape[0], BLOCK_M], dtype=tl.float32)
        for m in tl.static_range(BLOCK_M):
            # rows past M read row M - 1 again (their sums are never stored): no mask
            r = tl.sum(tl.where(rm == m, rstd, 0.0)) if NORM_INPUT else rstd
            s = _dot_row(w, x_ptr + tl.minimum(m, M - 1) * stride_xm, rk, K, norm_w_ptr, r,
                         EVEN_K, NORM_INPUT)
            acc += tl.where(rm[None, :] == m, s[:, None], 0.0)
    return acc


@triton.jit
def _virtual_rows(pid_n, N, BLOCK_N: tl.constexpr, GATED: tl.constexpr):
    """(rv, w_row, rows_total): a program sums BLOCK_N "virtual" rows rv, the weight's rows or with
    GATED pairs (gate row f, up row f), so that one program holds both factors of its outputs;
    w_row is each one's weight row, rows past N reading row N - 1 (their sums are never stored),
    so the weight loads need no row mask and stay full-width; rows_total the weight's rows."""
    rv = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if GATED:
        rows_total = 2 * N
        w_row = tl.minimum(rv // 2, N - 1) + (rv % 2) * N
    else:
        rows_total = N
        w_row = tl.minimum(rv, N - 1)
    return rv, w_row, rows_total


@triton.jit
def _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS: tl.constexpr,
                     GATED: tl.constexpr, RESIDUAL: tl.constexpr, OUT_DTYPE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] fp32 -> the output (`_store_out`); with SPLIT, this split's partial
    stored and the last split of the N tile to arrive (a counter, bumped atomically) adds them in
    split order and stores the output, setting the counter back to zero."""
    if SPLIT:
        out_mask = (rv < rows_total)[:, None] & (rm < M)[None, :]
        offsets = rm[None, :] * rows_total + rv[:, None]
        tl.store(partial_ptr + pid_k * M * rows_total + offsets, acc, mask=out_mask)
        # every thread's partial is stored before the (one-thread, acq_rel) atomic publishes it
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        num_splits = tl.num_programs(1)
        if arrived == num_splits - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in range(0, num_splits):
                # .cg: read from L2, where the other programs' stores are, not from this SM's L1
                total += tl.load(partial_ptr + s * M * rows_total + offsets, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(counter_ptr + pid_n, 0)
            _store_out(out_ptr, bias_ptr, total, pid_n, rm, N, M, stride_om, stat_ptr, HAS_BIAS,
                       GATED, RESIDUAL, OUT_DTYPE, BLOCK_N)
    else:
        _store_out(out_ptr, bias_ptr, acc, pid_n, rm, N, M, stride_om, stat_ptr, HAS_BIAS,
                   GATED, RESIDUAL, OUT_DTYPE, BLOCK_N)


@triton.jit(do_not_specialize=["M", "N"])
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] ([2N, K] = [gate | up] with GATED), K contiguous
    bias_ptr,  # [N] (unused without HAS_BIAS)
    out_ptr,  # [M, N]; with RESIDUAL the residual stream, updated in place
    partial_ptr,  # [split_k, M, rows] fp32, rows = N (2N with GATED) (unused without SPLIT)
    counter_ptr,  # [>= cdiv(rows, BLOCK_N)] int32, zero between calls (unused without SPLIT)
    norm_w_ptr,  # [K] RMSNorm weight applied to x (NORM_INPUT)
    stat_in_ptr,  # [n_stat_in, M] fp32 partial sums of squares of x's rows (NORM_INPUT)
    n_stat_in,
    eps,  # of that RMSNorm
    stat_ptr,  # [n_tiles, M] fp32 partial sums of squares of the new residual rows (RESIDUAL)
    M,
    N,  # output features
    K,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,  # out = silu(x @ gate^T) * (x @ up^T)
    NORM_INPUT: tl.constexpr,  # x := rms_norm(x) with the given statistic and weight
    RESIDUAL: tl.constexpr,  # out += x @ w^T, and the next RMSNorm's statistic of out
    SPLIT: tl.constexpr,
    USE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TAIL_K: tl.constexpr,  # 0, or K = BLOCK_K + TAIL_K in two tiles (M = 1, no split)
    DOT_PRECISION: tl.constexpr,
    W_EVICT: tl.constexpr,  # the FMA path's weight loads' eviction policy
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_rows = w_ptr + w_row.to(tl.int64)[:, None] * stride_wn
    rm = tl.arange(0, BLOCK_M)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if USE_DOT:
        pdl_wait(USE_PDL)
        if NORM_INPUT:
            rstd = _rstd(stat_in_ptr, n_stat_in, rm, M, K, eps, 64)[:, None]
        else:
            rstd = 1.0
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x_mask = (rm < M)[:, None]
            if not EVEN_K:
                x_mask = x_mask & (rk < K)[None, :]
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=x_mask, other=0.0)
            if NORM_INPUT:
                x = _normed_x(x, rk[None, :], norm_w_ptr, rstd, K, EVEN_K)
            acc = tl.dot(_w_tile(w_rows, rk, K, EVEN_K, ""), tl.trans(x), acc,
                         input_precision=DOT_PRECISION)
    else:
        # The first tile is loaded before waiting for the previous kernel (the weights are not
        # something it writes), so the weight stream starts under that kernel's tail. One tile in
        # flight per program after that: a second one's registers cost more programs per SM.
        rk = k_start + tl.arange(0, BLOCK_K)
        w = _w_tile(w_rows, rk, K, EVEN_K, W_EVICT)
        if TAIL_K > 0:
            rk_tail = BLOCK_K + tl.arange(0, TAIL_K)
            w_tail = _w_tile(w_rows, rk_tail, K, True, W_EVICT)
        pdl_wait(USE_PDL)
        # the producer's N tiles' partials, in one load up to 1024 of them
        rstd = _rstd(stat_in_ptr, n_stat_in, rm, M, K, eps, 1024) if NORM_INPUT else 1.0
        acc = _dot_rows(w, x_ptr, stride_xm, M, rk, K, norm_w_ptr, rstd, EVEN_K, NORM_INPUT,
                        BLOCK_M)
        if TAIL_K > 0:
            acc += _dot_rows(w_tail, x_ptr, stride_xm, M, rk_tail, K, norm_w_ptr, rstd, True,
                             NORM_INPUT, BLOCK_M)
        for k0 in range(k_start + BLOCK_K + TAIL_K, k_end, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            acc += _dot_rows(_w_tile(w_rows, rk, K, EVEN_K, W_EVICT), x_ptr, stride_xm, M, rk, K,
                             norm_w_ptr, rstd, EVEN_K, NORM_INPUT, BLOCK_M)
        if BLOCK_M == 1:
            acc = acc[:, None]  # [BLOCK_N, 1]

    _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS, GATED, RESIDUAL,
                     x_ptr.dtype.element_ty, BLOCK_N, BLOCK_M, SPLIT)


def linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K], K contiguous
    bias: torch.Tensor | None = None,  # [N]
    config: GemvConfig | None = None,
    rms: RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., N]
    """x @ weight^T (+ bias) with fp32 accumulation; `config` overrides `choose_config` (the
    benchmark sweeps it). With `rms`, x is first RMS-normalised with the statistic whose partial
    sums are given. The result is rounded to x's dtype, then stored as `out_dtype` (default:
    x's)."""
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    return _launch(x, weight, bias, config, rms=rms, out_dtype=out_dtype)[0]


def linear_silu_and_mul(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [2 * N, K] = [gate | up], K contiguous
    config: GemvConfig | None = None,
    rms: RmsInput | None = None,
) -> torch.Tensor:  # [..., N]
    """silu(x @ gate^T) * (x @ up^T), the gated MLP's first half, in one launch: each program
    sums matching gate and up rows, so the product is formed before anything is stored."""
    if weight.shape[0] % 2:
        raise ValueError(f"a [gate | up] weight needs an even number of rows, got {weight.shape[0]}")
    return _launch(x, weight, None, config, gated=True, rms=rms)[0]


def linear_add_residual(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K], K contiguous
    residual: torch.Tensor,  # [M, N], updated in place
    config: GemvConfig | None = None,
) -> torch.Tensor:  # [T, M] fp32
    """residual += x @ weight^T; returns partial sums of squares of the new residual rows (their
    sum over T is each row's), which the next RMSNorm needs, stored by the kernel's epilogue."""
    return _launch(x, weight, None, config, residual=residual)[1]


@dataclass
class GemvIO:
    """What a GEMV launch reads and writes, checked (shared by the 16-bit, fp8 and int4 GEMVs)."""
    x2: torch.Tensor  # [M, K], row-major
    out: torch.Tensor  # [M, N]: the residual stream itself with a residual
    M: int
    N: int
    done: bool  # nothing to compute (no rows, outputs or inputs): `out` holds the result
    stat_in: torch.Tensor  # the rms statistic [T, M] fp32 (a stand-in without rms)
    norm_w: torch.Tensor
    eps: float


def gemv_buffers(split: int, n_tiles: int, M: int, rows: int, out: torch.Tensor, residual: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A GEMV launch's work buffers: fp32 partial sums [split, M, rows] (`out` itself, unused,
    where K is not split) and with a residual the new rows' sums of squares [n_tiles, M] fp32."""
    partial = out
    if split > 1:
        if n_tiles > MAX_SPLIT_TILES:
            raise ValueError(f"split-K takes at most {MAX_SPLIT_TILES} N tiles, got {n_tiles}")
        partial = torch.empty((split, M, rows), dtype=torch.float32, device=out.device)
    stat = torch.empty((n_tiles, M), dtype=torch.float32, device=out.device) if residual else None
    return partial, stat


def gemv_io(x: torch.Tensor, rows: int, weight_k: int, bias: torch.Tensor | None, gated: bool,
            rms: RmsInput | None, residual: torch.Tensor | None, out_dtype: torch.dtype | None,
            max_rows: int | None = None, what: str = "the GEMV") -> GemvIO:
    """Checks a GEMV call of x [..., K] on a weight of `rows` rows ([gate | up] with `gated`) and
    `weight_k` inputs, and allocates its output (x's dtype, or `out_dtype`)."""
    K = x.shape[-1]
    N = rows // 2 if gated else rows
    if weight_k != K:
        raise ValueError(f"x has {K} features but the weight has {weight_k}")
    if gated and rows % 2:
        raise ValueError(f"a [gate | up] weight needs an even number of rows, got {rows}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if max_rows is not None and M > max_rows:
        raise ValueError(f"{what} takes at most {max_rows} rows, got {M}")
    if residual is not None:
        if residual.shape != (M, N) or residual.stride(-1) != 1:
            raise ValueError(f"residual {tuple(residual.shape)} must be a row-major [{M}, {N}]")
        out = residual
    else:
        out = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)  # [M, N]
    done = M == 0 or N == 0 or K == 0
    if done:
        # no terms: every sum is 0 (silu(0) * 0 = 0), plus the bias
        assert residual is None and rms is None, "the fused forms are for real projections"
        out.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(out))
    if rms is not None:
        stat_in, norm_w, eps = rms
        if stat_in.dim() != 2 or stat_in.shape[1] != M or stat_in.dtype != torch.float32:
            raise ValueError(f"rms statistic must be fp32 [T, {M}], got {stat_in.dtype} {tuple(stat_in.shape)}")
        stat_in = stat_in.contiguous()
    else:
        stat_in, norm_w, eps = out, out, 0.0
    return GemvIO(x2, out, M, N, done, stat_in, norm_w, eps)


def _launch(x, weight, bias, config: GemvConfig | None, gated: bool = False,
            rms: RmsInput | None = None, residual: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if weight.stride(1) != 1:
        raise ValueError("the weight must be contiguous along in_features")
    rows, K = weight.shape  # the weight's rows: the outputs, or [gate | up]
    io = gemv_io(x, rows, K, bias, gated, rms, residual, out_dtype)
    x2, out, M, N = io.x2, io.out, io.M, io.N
    if io.done:
        return out.view(*x.shape[:-1], N), None
    cfg = config or choose_config(M, rows, K, x.device)
    assert cfg.block_n % 2 == 0 or not gated
    assert not cfg.tail_k or (cfg.block_k + cfg.tail_k == K and cfg.split_k == 1 and not cfg.use_dot)
    block_m = DOT_BLOCK_M if cfg.use_dot else min(triton.next_power_of_2(M), FMA_BLOCK_M)
    if M > block_m:
        raise ValueError(f"the GEMV kernel takes at most {block_m} rows with this config, got {M}")
    n_tiles = triton.cdiv(rows, cfg.block_n)
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.block_k), cfg.split_k) * cfg.block_k
    split = triton.cdiv(K, k_per_split)
    counters = _counters(x.device)
    partial, stat = gemv_buffers(split, n_tiles, M, rows, out, residual is not None)
    use_pdl = pdl_enabled(x.device)
    _gemv_kernel[(n_tiles, split)](
        x2, weight, bias if bias is not None else out, out, partial, counters,
        io.norm_w, io.stat_in, io.stat_in.shape[0], io.eps, stat if stat is not None else out,
        M, N, K, k_per_split, x2.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None,
        GATED=gated,
        NORM_INPUT=rms is not None,
        RESIDUAL=residual is not None,
        SPLIT=split > 1,
        USE_DOT=cfg.use_dot,
        EVEN_K=K % cfg.block_k == 0 or cfg.tail_k > 0,
        USE_PDL=use_pdl,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        TAIL_K=cfg.tail_k,
        # the target's default but for fp32 (see attention.triton_common.dot_precision)
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        # a step reads each weight once, so the FMA path's weight loads are evicted first, keeping
        # the caches for the KV cache and activations
        W_EVICT="evict_first",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )
    return out.view(*x.shape[:-1], N), stat
