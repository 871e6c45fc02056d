"""Linear over GGUF weights kept quantized (reference.py's layout), for every row count.

Up to GEMV_MAX_ROWS rows (decode), a GEMV: a program owns BLOCK_N output features (virtual rows:
weight rows, or gate/up pairs with GATED) for x's rows (BLOCK_M) and walks its split of K in
tiles, each group's partial sums of exact codes times x (fp32) scaled by the group's s, plus b
times the sum of x's group where the format has a min term. So the products are those of the
exact codes with x as it is, and the reference (dequantize in fp32, multiply in fp32) differs by
summation order only. The next tile's scales load a tile ahead, the first tile before PDL's wait;
K is split until the GPU is full (a counter's last program reduces the splits), and the fused
forms of the decode chain run in hotpath.ops.linear.triton_gemv's epilogue (bias, silu(gate) *
up, add into the residual with each tile's sums of squares).

- 4-6-bit codes (`_gguf_sliced_kernel`): the int4 GEMV's structure (hotpath.ops.quant.triton_int4)
  on the sliced layout. A K tile is a 128-column run, [16 words, BLOCK_N] transposed; nibble j of
  its words (with their high bits) is the exact operand for x's 16 columns 16 j of the run,
  dequantized by the int4 kernels' PTX on NVIDIA (two words a register, the high bits OR-ed above
  the nibble) and by shifts elsewhere; the slices of a 32-column group chain their dots. x's rows
  are the dots' M, padded to 16.
- 8-bit codes (`_gguf_bytes_kernel`, Q8_0): a tile of GPI groups loads as one [BLOCK_N, GPI G]
  block. A dot has at least 16 rows, so below 16 rows of x the tile's groups share it: x's tile
  spread block-diagonally (row (m, j) holds x row m's group j, zeros elsewhere), whose result
  holds each group's partial sums apart.

More rows (prefill): `_dequantize_kernel` writes the weight in x's dtype (fp32 dequantization
rounded once: the 16-bit copy's very values) and the matmul is torch's (cuBLAS on a GPU): at many
rows the matmul's time dwarfs one pass over the weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.gguf.reference import RUN, GGUFFormat, GGUFWeight, check_shape
from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.linear.triton_gemv import (
    DOT_BLOCK_M,
    MAX_SPLIT_TILES,
    _store_or_reduce,
    _virtual_rows,
    gemv_buffers,
    gemv_io,
    split_for,
)
from hotpath.ops.norm.triton import rms_norm
from hotpath.ops.quant.triton_int4 import _dequant, _use_asm
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    sm_count,
    zeroed_counters,
)

# rows up to which a call runs the GEMV (with the fused forms); past them dequantize + torch's
# matmul is faster (docs/decisions.md)
GEMV_MAX_ROWS = 16
GEMV_PROGRAMS_PER_SM = 4
# codes a program's K tile holds at most (BLOCK_N x KT: 128 a thread at 4 warps)
TILE_CODES = 16384


@dataclass(frozen=True)
class GGUFLinearConfig:
    block_m: int  # x's rows a program holds (a power of 2, M <= block_m)
    block_n: int  # virtual rows per program
    split_k: int  # programs along K (1: no split)
    num_warps: int
    num_stages: int
    # 8-bit codes: scale groups a K tile holds, block_m * gpi >= 16 rows in the dot (see
    # _gguf_bytes_kernel); the sliced kernel's tile is a 128-column run
    gpi: int = 1
    asm: bool | None = None  # 4-6-bit codes: the int4 kernels' PTX dequantization (None: on NVIDIA GPUs)


def choose_config(M: int, rows: int, K: int, fmt: GGUFFormat, device: torch.device) -> GGUFLinearConfig:
    """The GEMV's tiles. 4-6-bit codes (the sliced kernel): x's rows padded to 16, a
    128-column run a K tile, 64-row tiles (fewer rows where the weight has fewer; 128 took
    shared-memory round trips for an H200, and 16 left a program too little work an iteration),
    K split where the row tiles leave SMs idle. 8-bit codes: x's rows padded to a power of 2 and,
    below 16, as many groups a K tile as fill the dot's 16 rows (one group a tile from 16 rows:
    there the rows are real work), the widest row tile up to 64 (TILE_CODES codes a tile) that
    still gives two programs an SM, K split where the row tiles leave SMs idle."""
    sms = sm_count(device)
    if fmt.bits < 8:
        block_m = max(DOT_BLOCK_M, triton.next_power_of_2(M))
        block_n = min(64, max(16, triton.next_power_of_2(rows)))
        n_tiles = triton.cdiv(rows, block_n)
        runs = triton.cdiv(K, RUN)
        split = 1 if n_tiles >= sms else split_for(n_tiles, runs, 1, device, GEMV_PROGRAMS_PER_SM)
        return GGUFLinearConfig(block_m, block_n, split, 4, 3)
    block_m = triton.next_power_of_2(M)
    gpi = max(1, DOT_BLOCK_M // block_m)
    kt = gpi * fmt.group
    widths = [b for b in (64, 32, 16) if b * kt <= TILE_CODES] or [16]
    block_n = next((b for b in widths if triton.cdiv(rows, b) >= 2 * sms), widths[-1])
    n_tiles = triton.cdiv(rows, block_n)
    split = 1 if n_tiles >= sms else split_for(n_tiles, K, kt, device, GEMV_PROGRAMS_PER_SM)
    return GGUFLinearConfig(block_m, block_n, split, 4, 3, gpi)


@triton.jit
def _tile_bytes(codes_ptr, c_rows, k0, k_end, KT: tl.constexpr, EVICT: tl.constexpr):
    """The 8-bit codes (int32) of columns k0 .. k0 + KT of the rows at offsets c_rows: [BLOCK_N,
    KT], 0 from column k_end on."""
    ck = k0 + tl.arange(0, KT)
    return tl.load(codes_ptr + c_rows[:, None] + ck[None, :], mask=(ck < k_end)[None, :], other=0,
                   eviction_policy=EVICT).to(tl.int32)


@triton.jit
def _tile_scales(d_ptr, d_rows, k0, k_end, G: tl.constexpr, GPI: tl.constexpr):
    """8-bit codes: the scales (fp32 [GPI, BLOCK_N]) of the GPI groups from column k0, for the rows
    at d_rows; 0 for groups from k_end on."""
    g = k0 // G + tl.arange(0, GPI)
    return tl.load(d_ptr + d_rows[None, :] + g[:, None], mask=(g < k_end // G)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _tile_dot(acc, x_ptr, stride_xm, M, q, s, k0, k_end, G: tl.constexpr, OFFSET: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GPI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """8-bit codes: acc [BLOCK_M, BLOCK_N] += for each group j of the tile: s_j * (x_j @ (q_j -
    OFFSET)^T). With GPI > 1 one dot does every group: x's tile spread block-diagonally over
    BLOCK_M * GPI rows (row (m, j) holds x row m's group j, zeros elsewhere), the rows a dot pads
    to anyway at one row of x; its [BLOCK_M, GPI, BLOCK_N] result is scaled and summed."""
    KT: tl.constexpr = GPI * G
    rm = tl.arange(0, BLOCK_M)
    ck = k0 + tl.arange(0, KT)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + ck[None, :], mask=(rm < M)[:, None] & (ck < k_end)[None, :],
                other=0.0)  # [BLOCK_M, KT]
    w = (q - OFFSET).to(x.dtype)  # exact integers
    if GPI == 1:
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION) * s
    else:
        own = (tl.arange(0, KT) // G)[None, :] == tl.arange(0, GPI)[:, None]  # [GPI, KT]
        xb = tl.reshape(tl.where(own[None, :, :], x[:, None, :], 0.0), (BLOCK_M * GPI, KT))
        part = tl.dot(xb, tl.trans(w), input_precision=DOT_PRECISION)  # [BLOCK_M * GPI, BLOCK_N]
        acc += tl.sum(tl.reshape(part, (BLOCK_M, GPI, BLOCK_N)) * s[None, :, :], axis=1)
    return acc


@triton.jit(do_not_specialize=["M", "N"])
def _gguf_bytes_kernel(
    x_ptr,  # [M, K]
    codes_ptr,  # int8 [rows, K]; rows = N (2N with GATED)
    d_ptr,  # fp16 [rows, K / G]
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]; with RESIDUAL the residual stream, updated in place
    partial_ptr,  # [split, M, rows] fp32 (SPLIT)
    counter_ptr,  # [>= n tiles] int32, zero between calls (SPLIT)
    stat_ptr,  # [n_tiles, M] fp32 (RESIDUAL)
    M,
    N,  # output features
    K,
    cols_per_split,  # a multiple of the K tile
    stride_xm,
    stride_c,
    stride_d,
    stride_om,
    G: tl.constexpr,
    OFFSET: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GPI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """8-bit codes (Q8_0: s = d, no min term)."""
    KT: tl.constexpr = GPI * G
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_row = w_row.to(tl.int64)
    c_rows = w_row * stride_c
    d_rows = w_row * stride_d
    k_start = pid_k * cols_per_split
    k_end = tl.minimum(k_start + cols_per_split, K)
    # the weights are written by no kernel: the first tile and its scales load before the wait
    q = _tile_bytes(codes_ptr, c_rows, k_start, k_end, KT, "evict_first")
    s = _tile_scales(d_ptr, d_rows, k_start, k_end, G, GPI)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # each tile's successor's scales load a tile ahead (small loads the pipeliner leaves
    # synchronous: loaded where they are used, every tile would wait a memory round trip)
    s_next = _tile_scales(d_ptr, d_rows, k_start + KT, k_end, G, GPI)
    acc = _tile_dot(acc, x_ptr, stride_xm, M, q, s, k_start, k_end, G, OFFSET, BLOCK_M, BLOCK_N, GPI, DOT_PRECISION)
    s = s_next
    for k0 in range(k_start + KT, k_end, KT):
        s_next = _tile_scales(d_ptr, d_rows, k0 + KT, k_end, G, GPI)
        q = _tile_bytes(codes_ptr, c_rows, k0, k_end, KT, "evict_first")
        acc = _tile_dot(acc, x_ptr, stride_xm, M, q, s, k0, k_end, G, OFFSET, BLOCK_M, BLOCK_N, GPI, DOT_PRECISION)
        s = s_next
    rm = tl.arange(0, BLOCK_M)
    acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M]
    _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS, GATED, RESIDUAL, x_ptr.dtype.element_ty,
                     BLOCK_N, BLOCK_M, SPLIT)


@triton.jit
def _run_load(c_cols, h_cols, u0, RUN_COLS: tl.constexpr, BITS: tl.constexpr, EVICT: tl.constexpr):
    """The code words of the 128-column run from word u0, transposed ([16, BLOCK_N] int32 from
    c_cols [1, BLOCK_N], the rows' word pointers), and (BITS 5, 6) their high bits alike."""
    rw = u0 + tl.arange(0, RUN_COLS // 8)[:, None]
    words = tl.load(c_cols + rw, eviction_policy=EVICT)
    hi = words
    if BITS > 4:
        hi = tl.load(h_cols + rw, eviction_policy=EVICT).to(tl.int32)
    return words, hi


@triton.jit
def _run_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, run, n_groups, RUN_COLS: tl.constexpr,
                G: tl.constexpr, SUB: tl.constexpr, SUB_SCALES: tl.constexpr, HAS_MIN: tl.constexpr):
    """The scale terms of the groups of a 128-column run as stored (d, dm, sc, mc: tuples of RUN / G
    [BLOCK_N], each loaded once: a run's groups share their superblock's d), for the rows at
    d_rows / s_rows; 0 for groups from n_groups on (the codes' padding, a run past K). Returned
    as loaded, not multiplied: a run ahead, the loads must not be waited for (_run_terms)."""
    GR: tl.constexpr = RUN_COLS // G
    PER_D: tl.constexpr = min(SUB, GR)  # consecutive groups of a run under one d
    ds = ()
    dms = ()
    scs = ()
    mcs = ()
    for r in tl.static_range(GR):
        g = run * GR + r
        ok = tl.full([1], g, tl.int32) < n_groups
        if r % PER_D == 0:
            d = tl.load(d_ptr + d_rows + g // SUB, mask=ok, other=0.0)
            dm = d
            if HAS_MIN:
                dm = tl.load(dm_ptr + d_rows + g // SUB, mask=ok, other=0.0)
        sc = d
        mc = d
        if SUB_SCALES:
            sc = tl.load(sc_ptr + s_rows + g, mask=ok, other=0)
            if HAS_MIN:
                mc = tl.load(mc_ptr + s_rows + g, mask=ok, other=0)
        ds = ds + (d,)
        dms = dms + (dm,)
        scs = scs + (sc,)
        mcs = mcs + (mc,)
    return ds, dms, scs, mcs


@triton.jit
def _run_terms(terms, r: tl.constexpr, SUB_SCALES: tl.constexpr, HAS_MIN: tl.constexpr):
    """Group r's scale s and min term b (fp32 [BLOCK_N]; b = s without a min) from _run_scales."""
    ds, dms, scs, mcs = terms
    s = ds[r].to(tl.float32)
    b = s
    if SUB_SCALES:
        s = s * scs[r].to(tl.float32)
    if HAS_MIN:
        b = dms[r].to(tl.float32)
        if SUB_SCALES:
            b = b * mcs[r].to(tl.float32)
    return s, b


@triton.jit
def _run_dot(acc, x_ptr, stride_xm, M, K, words, hi, terms, run, RUN_COLS: tl.constexpr, BITS: tl.constexpr,
             G: tl.constexpr,
             OFFSET: tl.constexpr, SUB_SCALES: tl.constexpr, HAS_MIN: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += the run's 8 slices: nibble j of its words (with its high bits)
    minus OFFSET, exact in x's dtype (the int4 kernels' dequantization), against x's 16 columns
    128 run + 16 j; the slices of a group chained in one dot accumulator, times the group's scale
    (+ b times the sum of x's group)."""
    PER_GROUP: tl.constexpr = G // 16  # slices a group
    rm = tl.arange(0, BLOCK_M)
    m_ok = (rm < M)[:, None]
    offsets = ()
    for j in tl.static_range(8):
        offsets = offsets + (tl.full([1, BLOCK_N], OFFSET, tl.int32),)
    qs = _dequant(words, offsets, x_ptr.dtype.element_ty, USE_ASM, hi, BITS - 4)  # 8 x [16, BLOCK_N]
    for g in tl.static_range(8 // PER_GROUP):
        xs = tl.zeros([BLOCK_M], dtype=tl.float32)
        for i in tl.static_range(PER_GROUP):
            ck = run * RUN_COLS + 16 * (g * PER_GROUP + i) + tl.arange(0, 16)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + ck[None, :], mask=m_ok & (ck < K)[None, :],
                        other=0.0)  # [BLOCK_M, 16]
            if i == 0:
                part = tl.dot(x, qs[g * PER_GROUP], input_precision=DOT_PRECISION)
            else:
                part = tl.dot(x, qs[g * PER_GROUP + i], part, input_precision=DOT_PRECISION)
            if HAS_MIN:
                xs += tl.sum(x.to(tl.float32), axis=1)
        sg, bg = _run_terms(terms, g, SUB_SCALES, HAS_MIN)
        acc += part * sg[None, :]
        if HAS_MIN:
            acc += xs[:, None] * bg[None, :]
    return acc


@triton.jit(do_not_specialize=["M", "N"])
def _gguf_sliced_kernel(
    x_ptr,  # [M, K]
    codes_ptr,  # int32 [rows, Kp / 8], the sliced code words; rows = N (2N with GATED)
    high_ptr,  # uint8 / int16 [rows, Kp / 8] (BITS 5, 6)
    d_ptr,  # fp16 [rows, K / (G SUB)]
    dm_ptr,  # fp16 [rows, K / (G SUB)] (HAS_MIN)
    sc_ptr,  # uint8 / int8 [rows, K / G] (SUB_SCALES)
    mc_ptr,  # uint8 [rows, K / G] (SUB_SCALES and HAS_MIN)
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]; with RESIDUAL the residual stream, updated in place
    partial_ptr,  # [split, M, rows] fp32 (SPLIT)
    counter_ptr,  # [>= n tiles] int32, zero between calls (SPLIT)
    stat_ptr,  # [n_tiles, M] fp32 (RESIDUAL)
    M,
    N,  # output features
    K,
    runs_per_split,
    stride_xm,
    stride_c,  # row strides (in elements) of the code words, the high bits, d / dm and sc / mc
    stride_h,
    stride_d,
    stride_s,
    stride_om,
    RUN_COLS: tl.constexpr,
    BITS: tl.constexpr,
    G: tl.constexpr,
    SUB: tl.constexpr,
    OFFSET: tl.constexpr,
    SUB_SCALES: tl.constexpr,
    HAS_MIN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_ASM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """4-6-bit codes in the sliced layout (reference.py): the int4 GEMV's structure
    (hotpath.ops.quant.triton_int4), a 128-column run a K tile, x's padded rows as the dots' M."""
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_row = w_row.to(tl.int64)
    c_cols = codes_ptr + (w_row * stride_c)[None, :]
    h_cols = high_ptr + (w_row * stride_h)[None, :]
    d_rows = w_row * stride_d
    s_rows = w_row * stride_s
    n_groups = K // G
    r_start = pid_k * runs_per_split
    r_end = tl.minimum(r_start + runs_per_split, tl.cdiv(K, RUN_COLS))
    # the weights are written by no kernel: the first run and its scales load before the wait
    words, hi = _run_load(c_cols, h_cols, r_start * (RUN_COLS // 8), RUN_COLS, BITS, "evict_first")
    terms = _run_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, r_start, n_groups, RUN_COLS, G, SUB,
                        SUB_SCALES, HAS_MIN)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # each run's successor's scales load a run ahead (as the int4 GEMV's do)
    terms_next = _run_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, r_start + 1, n_groups, RUN_COLS, G, SUB,
                             SUB_SCALES, HAS_MIN)
    acc = _run_dot(acc, x_ptr, stride_xm, M, K, words, hi, terms, r_start, RUN_COLS, BITS, G, OFFSET, SUB_SCALES,
                   HAS_MIN, BLOCK_M, BLOCK_N, USE_ASM, DOT_PRECISION)
    terms = terms_next
    for run in range(r_start + 1, r_end):
        terms_next = _run_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, run + 1, n_groups, RUN_COLS, G, SUB,
                                 SUB_SCALES, HAS_MIN)
        words, hi = _run_load(c_cols, h_cols, run * (RUN_COLS // 8), RUN_COLS, BITS, "evict_first")
        acc = _run_dot(acc, x_ptr, stride_xm, M, K, words, hi, terms, run, RUN_COLS, BITS, G, OFFSET, SUB_SCALES,
                       HAS_MIN, BLOCK_M, BLOCK_N, USE_ASM, DOT_PRECISION)
        terms = terms_next
    rm = tl.arange(0, BLOCK_M)
    acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M]
    _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS, GATED, RESIDUAL, x_ptr.dtype.element_ty,
                     BLOCK_N, BLOCK_M, SPLIT)


def _launch(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None,
            config: GGUFLinearConfig | None, gated: bool = False, rms: RmsInput | None = None,
            residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    fmt = w.fmt
    rows, K = w.shape
    check_shape(fmt, rows, K)
    if rms is not None:
        # normalised by a launch of its own, as the int4 GEMV does
        x = rms_norm(x, rms[1], rms[2])
    io = gemv_io(x, rows, K, bias, gated, None, residual, out_dtype, GEMV_MAX_ROWS, "the GGUF GEMV")
    if io.done:
        return io.out.view(*x.shape[:-1], io.N), None
    x2, out, M, N = io.x2, io.out, io.M, io.N
    cfg = config or choose_config(M, rows, K, fmt, x.device)
    assert cfg.block_n % 2 == 0 or not gated
    assert M <= cfg.block_m and cfg.block_m * cfg.gpi >= DOT_BLOCK_M, "one tile of x's rows; a dot's 16 rows"
    n_tiles = triton.cdiv(rows, cfg.block_n)
    # K tiles: 128-column runs (sliced codes) or GPI groups (bytes); a split takes whole tiles
    kt = RUN if fmt.bits < 8 else cfg.gpi * fmt.group
    tiles = triton.cdiv(K, kt)
    per_split = triton.cdiv(tiles, max(1, min(cfg.split_k, tiles)))
    split = triton.cdiv(tiles, per_split)
    partial, stat = gemv_buffers(split, n_tiles, M, rows, out, residual is not None)
    use_pdl = pdl_enabled(x.device)
    common = dict(HAS_BIAS=bias is not None, GATED=gated, RESIDUAL=residual is not None, SPLIT=split > 1,
                  USE_PDL=use_pdl, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  DOT_PRECISION="ieee" if x.dtype == torch.float32 else None, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, **pdl_launch(use_pdl))
    bias_or_out = bias if bias is not None else out
    counters = zeroed_counters("gguf linear split-K", MAX_SPLIT_TILES, x.device)
    stat_or_out = stat if stat is not None else out
    if fmt.bits < 8:
        _gguf_sliced_kernel[(n_tiles, split)](
            x2, w.codes, w.high, w.d, w.dm, w.sc, w.mc, bias_or_out, out, partial, counters, stat_or_out,
            M, N, K, per_split, x2.stride(0), w.codes.stride(0), max(1, w.high.stride(0)), w.d.stride(0),
            max(1, w.sc.stride(0)), out.stride(0),
            RUN_COLS=RUN, BITS=fmt.bits, G=fmt.group, SUB=fmt.sub, OFFSET=fmt.offset, SUB_SCALES=fmt.sub_scales,
            HAS_MIN=fmt.has_min, USE_ASM=_use_asm(x, cfg.asm), **common)
    else:
        assert not (fmt.sub_scales or fmt.has_min), "8-bit codes: Q8_0's form"
        _gguf_bytes_kernel[(n_tiles, split)](
            x2, w.codes, w.d, bias_or_out, out, partial, counters, stat_or_out,
            M, N, K, per_split * kt, x2.stride(0), w.codes.stride(0), w.d.stride(0), out.stride(0),
            G=fmt.group, OFFSET=fmt.offset, GPI=cfg.gpi, **common)
    return out.view(*x.shape[:-1], N), stat


@triton.jit
def _dequantize_kernel(
    codes_ptr, high_ptr, d_ptr, dm_ptr, sc_ptr, mc_ptr,  # the layout, as the GEMV kernels'
    out_ptr,  # [N, K] in the output dtype
    N,
    K,
    stride_c,
    stride_h,
    stride_d,
    stride_s,
    stride_o,
    RUN_COLS: tl.constexpr,
    BITS: tl.constexpr,
    G: tl.constexpr,
    SUB: tl.constexpr,
    OFFSET: tl.constexpr,
    SUB_SCALES: tl.constexpr,
    HAS_MIN: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """A program: BLOCK_N rows of one 128-column run."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_row = tl.minimum(rows, N - 1).to(tl.int64)  # rows past N read row N - 1, never stored
    run = tl.program_id(1)
    o_rows = out_ptr + rows.to(tl.int64) * stride_o
    row_ok = rows < N
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    if BITS == 8:
        GPI: tl.constexpr = RUN_COLS // G
        q = _tile_bytes(codes_ptr, w_row * stride_c, run * RUN_COLS, K, RUN_COLS, "")
        s = _tile_scales(d_ptr, w_row * stride_d, run * RUN_COLS, K, G, GPI)  # [GPI, BLOCK_N]
        w = tl.reshape((q - OFFSET).to(tl.float32), (BLOCK_N, GPI, G)) * tl.trans(s)[:, :, None]
        ck = run * RUN_COLS + tl.arange(0, RUN_COLS)
        tl.store(o_rows[:, None] + ck[None, :], tl.reshape(w, (BLOCK_N, RUN_COLS)).to(DTYPE),
                 mask=row_ok[:, None] & (ck < K)[None, :])
    else:
        WIDTH: tl.constexpr = BITS - 4
        words, hi = _run_load(codes_ptr + (w_row * stride_c)[None, :], high_ptr + (w_row * stride_h)[None, :],
                              run * (RUN_COLS // 8), RUN_COLS, BITS, "")
        terms = _run_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, w_row * stride_d, w_row * stride_s, run, K // G, RUN_COLS,
                            G, SUB, SUB_SCALES, HAS_MIN)
        for j in tl.static_range(8):
            q = (words >> (4 * j)) & 15
            if BITS > 4:
                q = q | (((hi >> (WIDTH * j)) & ((1 << WIDTH) - 1)) << 4)
            s, b = _run_terms(terms, (16 * j) // G, SUB_SCALES, HAS_MIN)
            w = (q - OFFSET).to(tl.float32) * s[None, :]  # [16, BLOCK_N]
            if HAS_MIN:
                w += b[None, :]
            ck = run * RUN_COLS + 16 * j + tl.arange(0, 16)
            tl.store(o_rows[None, :] + ck[:, None], w.to(DTYPE), mask=row_ok[None, :] & (ck < K)[:, None])


def dequantize(w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:  # [N, K]
    """The weight in `dtype`: reference.dequantize's float32 values, rounded once."""
    fmt = w.fmt
    N, K = w.shape
    out = torch.empty(N, K, dtype=dtype, device=w.codes.device)
    block_n = 64
    grid = (triton.cdiv(N, block_n), triton.cdiv(K, RUN))
    _dequantize_kernel[grid](
        w.codes, w.high, w.d, w.dm, w.sc, w.mc, out, N, K, w.codes.stride(0), max(1, w.high.stride(0)),
        w.d.stride(0), max(1, w.sc.stride(0)), out.stride(0),
        RUN_COLS=RUN, BITS=fmt.bits, G=fmt.group, SUB=fmt.sub, OFFSET=fmt.offset, SUB_SCALES=fmt.sub_scales,
        HAS_MIN=fmt.has_min, BLOCK_N=block_n, num_warps=4)
    return out


def gguf_linear(x: torch.Tensor, w: GGUFWeight, bias: torch.Tensor | None = None,
                rms: RmsInput | None = None, out_dtype: torch.dtype | None = None,
                config: GGUFLinearConfig | None = None) -> torch.Tensor:  # [..., N]
    """x @ W^T (+ bias): the GEMV up to GEMV_MAX_ROWS rows (`rms=` there only), else the weight
    dequantized into x's dtype and torch's matmul."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows <= GEMV_MAX_ROWS:
        return _launch(x, w, bias, config, rms=rms, out_dtype=out_dtype)[0]
    assert rms is None, "rms= is for the few-rows path"
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features but the weight has {w.shape[1]}")
    out = torch.nn.functional.linear(x, dequantize(w, x.dtype), bias)
    return out if out_dtype is None else out.to(out_dtype)


def gguf_linear_silu_and_mul(x: torch.Tensor, w: GGUFWeight, rms: RmsInput | None = None,
                             config: GGUFLinearConfig | None = None) -> torch.Tensor:  # [..., N / 2]
    """silu(x @ gate^T) * (x @ up^T) for W = [gate | up], up to GEMV_MAX_ROWS rows."""
    return _launch(x, w, None, config, gated=True, rms=rms)[0]


def gguf_linear_add_residual(x: torch.Tensor, w: GGUFWeight, residual: torch.Tensor,
                             config: GGUFLinearConfig | None = None) -> torch.Tensor:  # [T, M] fp32
    """residual += x @ W^T in place, up to GEMV_MAX_ROWS rows; returns the new rows' partial sums of
    squares (hotpath.ops.linear's statistic)."""
    return _launch(x, w, None, config, residual=residual)[1]
