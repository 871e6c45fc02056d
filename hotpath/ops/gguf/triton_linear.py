"""Linear over GGUF weights kept quantized (reference.py's layout), for every row count.

Up to GEMV_MAX_ROWS rows (decode): `_gguf_linear_kernel`. A program owns BLOCK_N output features
(virtual rows: weight rows, or gate/up pairs with GATED) for x's rows (BLOCK_M, a power of 2), and
walks its split of K in tiles of GPI scale groups. A tile's codes load as one [BLOCK_N, GPI G]
block (the high-bit plane beside the low nibbles), are unpacked into exact integers q - offset in
x's dtype and take one dot with x's columns. A dot has at least 16 rows, so below 16 rows of x
the tile's GPI groups share it: x's tile spread block-diagonally (row (m, j) holds x row m's
group j, zeros elsewhere), whose result holds each group's partial sums apart, to be multiplied by
the group's scale s (fp32) and summed, plus b times the sum of x's group where the format has a
min term. So the products are those of the exact codes with x as it is, and the reference
(dequantize in fp32, multiply in fp32) differs by summation order only. The next tile's scales
load a tile ahead, the first tile before PDL's wait; K is split until the GPU is full (a
counter's last program reduces the splits), and the fused forms of the decode chain run in
hotpath.ops.linear.triton_gemv's epilogue (bias, silu(gate) * up, add into the residual with each
tile's sums of squares).

More rows (prefill): `_dequantize_kernel` writes the weight in x's dtype (fp32 dequantization
rounded once: the 16-bit copy's very values) and the matmul is torch's (cuBLAS on a GPU): at many
rows the matmul's time dwarfs one pass over the weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.gguf.reference import GGUFWeight, check_shape
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
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    sm_count,
    zeroed_counters,
)

GEMV_MAX_ROWS = 64  # rows up to which a call runs the GEMV (with the fused forms)
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
    # scale groups a K tile holds; with block_m * gpi >= 16 rows in the dot (see the kernel)
    gpi: int = 1


def choose_config(M: int, rows: int, K: int, group: int, device: torch.device) -> GGUFLinearConfig:
    """The GEMV's tiles: x's rows padded to a power of 2 and, below 16, as many groups a K tile as
    fill the dot's 16 rows (one group a tile from 16 rows: there the rows are real work); the
    widest row tile (up to 64 rows, TILE_CODES codes a tile) that still gives two programs an SM;
    K split only where the row tiles alone leave SMs idle (a split's reduction is a fixed cost)."""
    block_m = triton.next_power_of_2(M)
    gpi = max(1, DOT_BLOCK_M // block_m)
    kt = gpi * group
    sms = sm_count(device)
    widths = [b for b in (64, 32, 16) if b * kt <= TILE_CODES] or [16]
    block_n = next((b for b in widths if triton.cdiv(rows, b) >= 2 * sms), widths[-1])
    n_tiles = triton.cdiv(rows, block_n)
    split = 1 if n_tiles >= sms else split_for(n_tiles, K, kt, device, GEMV_PROGRAMS_PER_SM)
    return GGUFLinearConfig(block_m, block_n, split, 4, 3, gpi)


@triton.jit
def _tile_codes(codes_ptr, high_ptr, c_rows, h_rows, k0, k_end, BLOCK_N: tl.constexpr,
                KT: tl.constexpr, BITS: tl.constexpr, EVICT: tl.constexpr):
    """The raw codes (int32, 0 .. 2^BITS - 1; int8's sign kept for BITS 8) of columns k0 .. k0 + KT
    of the rows at c_rows / h_rows (their offsets in the code and high-bit planes): [BLOCK_N, KT],
    0 from column k_end on."""
    if BITS == 8:
        ck = k0 + tl.arange(0, KT)
        q = tl.load(codes_ptr + c_rows[:, None] + ck[None, :], mask=(ck < k_end)[None, :], other=0,
                    eviction_policy=EVICT).to(tl.int32)
    else:
        cb = k0 // 2 + tl.arange(0, KT // 2)
        lo = tl.load(codes_ptr + c_rows[:, None] + cb[None, :], mask=(cb < k_end // 2)[None, :], other=0,
                     eviction_policy=EVICT)
        q = (lo.to(tl.int32)[:, :, None] >> (4 * tl.arange(0, 2))[None, None, :]) & 15
        q = tl.reshape(q, (BLOCK_N, KT))  # [BLOCK_N, KT / 2, 2] -> column 2j + i
        if BITS > 4:
            WIDTH: tl.constexpr = BITS - 4
            PER: tl.constexpr = 8 // WIDTH  # codes a high-plane byte
            hb = k0 // PER + tl.arange(0, KT // PER)
            hi = tl.load(high_ptr + h_rows[:, None] + hb[None, :], mask=(hb < k_end // PER)[None, :],
                         other=0, eviction_policy=EVICT)
            h = (hi.to(tl.int32)[:, :, None] >> (WIDTH * tl.arange(0, PER))[None, None, :]) & ((1 << WIDTH) - 1)
            q = q | (tl.reshape(h, (BLOCK_N, KT)) << 4)
    return q


@triton.jit
def _tile_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, k0, k_end, G: tl.constexpr,
                 SUB: tl.constexpr, GPI: tl.constexpr, SUB_SCALES: tl.constexpr,
                 HAS_MIN: tl.constexpr):
    """The scales s and min terms b (fp32 [GPI, BLOCK_N]; b is s where there is no min term) of
    the GPI groups from column k0, for the rows at d_rows / s_rows; 0 for groups from k_end on."""
    g = k0 // G + tl.arange(0, GPI)
    valid = (g < k_end // G)[:, None]
    s = tl.load(d_ptr + d_rows[None, :] + (g // SUB)[:, None], mask=valid, other=0.0).to(tl.float32)
    if SUB_SCALES:
        s *= tl.load(sc_ptr + s_rows[None, :] + g[:, None], mask=valid, other=0).to(tl.float32)
    b = s
    if HAS_MIN:
        b = tl.load(dm_ptr + d_rows[None, :] + (g // SUB)[:, None], mask=valid, other=0.0).to(tl.float32)
        if SUB_SCALES:
            b *= tl.load(mc_ptr + s_rows[None, :] + g[:, None], mask=valid, other=0).to(tl.float32)
    return s, b


@triton.jit
def _tile_dot(acc, x_ptr, stride_xm, M, q, s, b, k0, k_end, G: tl.constexpr, OFFSET: tl.constexpr,
              HAS_MIN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GPI: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += for each group j of the tile: s_j * (x_j @ (q_j - OFFSET)^T)
    (+ b_j * sum(x_j)). With GPI > 1 one dot does every group: x's tile spread block-diagonally
    over BLOCK_M * GPI rows (row (m, j) holds x row m's group j, zeros elsewhere), the rows a dot
    pads to anyway at one row of x; its [BLOCK_M, GPI, BLOCK_N] result is scaled and summed."""
    KT: tl.constexpr = GPI * G
    rm = tl.arange(0, BLOCK_M)
    ck = k0 + tl.arange(0, KT)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + ck[None, :], mask=(rm < M)[:, None] & (ck < k_end)[None, :],
                other=0.0)  # [BLOCK_M, KT]
    w = (q - OFFSET).to(x.dtype)  # exact integers
    if GPI == 1:
        part = tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        acc += part * s
        if HAS_MIN:
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * b
    else:
        own = (tl.arange(0, KT) // G)[None, :] == tl.arange(0, GPI)[:, None]  # [GPI, KT]
        xb = tl.where(own[None, :, :], x[:, None, :], 0.0)
        xb = tl.reshape(xb, (BLOCK_M * GPI, KT))
        part = tl.dot(xb, tl.trans(w), input_precision=DOT_PRECISION)  # [BLOCK_M * GPI, BLOCK_N]
        part = tl.reshape(part, (BLOCK_M, GPI, BLOCK_N))
        acc += tl.sum(part * s[None, :, :], axis=1)
        if HAS_MIN:
            xs = tl.sum(tl.reshape(x.to(tl.float32), (BLOCK_M, GPI, G)), axis=2)  # [BLOCK_M, GPI]
            acc += tl.sum(xs[:, :, None] * b[None, :, :], axis=1)
    return acc


@triton.jit(do_not_specialize=["M", "N"])
def _gguf_linear_kernel(
    x_ptr,  # [M, K]
    codes_ptr,  # uint8 [rows, K / 2] or int8 [rows, K] (BITS 8); rows = N (2N with GATED)
    high_ptr,  # uint8 [rows, K (BITS - 4) / 8] (BITS 5, 6)
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
    cols_per_split,  # a multiple of the K tile
    stride_xm,
    stride_c,  # row strides of the code plane, the high plane, d / dm and sc / mc
    stride_h,
    stride_d,
    stride_s,
    stride_om,
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
    GPI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    KT: tl.constexpr = GPI * G
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_row = w_row.to(tl.int64)
    c_rows = w_row * stride_c
    h_rows = w_row * stride_h
    d_rows = w_row * stride_d
    s_rows = w_row * stride_s
    k_start = pid_k * cols_per_split
    k_end = tl.minimum(k_start + cols_per_split, K)
    # the weights are written by no kernel: the first tile and its scales load before the wait
    q = _tile_codes(codes_ptr, high_ptr, c_rows, h_rows, k_start, k_end, BLOCK_N, KT, BITS, "evict_first")
    s, b = _tile_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, k_start, k_end, G, SUB, GPI,
                        SUB_SCALES, HAS_MIN)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # each tile's successor's scales load a tile ahead (small loads the pipeliner leaves
    # synchronous: loaded where they are used, every tile would wait a memory round trip)
    s_next, b_next = _tile_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, k_start + KT, k_end, G,
                                  SUB, GPI, SUB_SCALES, HAS_MIN)
    acc = _tile_dot(acc, x_ptr, stride_xm, M, q, s, b, k_start, k_end, G, OFFSET, HAS_MIN, BLOCK_M, BLOCK_N, GPI,
                    DOT_PRECISION)
    s, b = s_next, b_next
    for k0 in range(k_start + KT, k_end, KT):
        s_next, b_next = _tile_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, d_rows, s_rows, k0 + KT, k_end, G,
                                      SUB, GPI, SUB_SCALES, HAS_MIN)
        q = _tile_codes(codes_ptr, high_ptr, c_rows, h_rows, k0, k_end, BLOCK_N, KT, BITS, "evict_first")
        acc = _tile_dot(acc, x_ptr, stride_xm, M, q, s, b, k0, k_end, G, OFFSET, HAS_MIN, BLOCK_M, BLOCK_N, GPI,
                        DOT_PRECISION)
        s, b = s_next, b_next
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
    cfg = config or choose_config(M, rows, K, fmt.group, x.device)
    assert cfg.block_n % 2 == 0 or not gated
    assert M <= cfg.block_m and cfg.block_m * cfg.gpi >= DOT_BLOCK_M, "one tile of x's rows; a dot's 16 rows"
    n_tiles = triton.cdiv(rows, cfg.block_n)
    kt = cfg.gpi * fmt.group
    # a split's columns: whole K tiles but the last split's
    tiles = triton.cdiv(K, kt)
    per_split = triton.cdiv(tiles, max(1, min(cfg.split_k, tiles))) * kt
    split = triton.cdiv(K, per_split)
    partial, stat = gemv_buffers(split, n_tiles, M, rows, out, residual is not None)
    use_pdl = pdl_enabled(x.device)
    _gguf_linear_kernel[(n_tiles, split)](
        x2, w.codes, w.high, w.d, w.dm, w.sc, w.mc, bias if bias is not None else out, out, partial,
        zeroed_counters("gguf linear split-K", MAX_SPLIT_TILES, x.device),
        stat if stat is not None else out,
        M, N, K, per_split, x2.stride(0), w.codes.stride(0), max(1, w.high.stride(0)), w.d.stride(0),
        max(1, w.sc.stride(0)), out.stride(0),
        BITS=fmt.bits,
        G=fmt.group,
        SUB=fmt.sub,
        OFFSET=fmt.offset,
        SUB_SCALES=fmt.sub_scales,
        HAS_MIN=fmt.has_min,
        HAS_BIAS=bias is not None,
        GATED=gated,
        RESIDUAL=residual is not None,
        SPLIT=split > 1,
        USE_PDL=use_pdl,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        GPI=cfg.gpi,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )
    return out.view(*x.shape[:-1], N), stat


@triton.jit
def _dequantize_kernel(
    codes_ptr, high_ptr, d_ptr, dm_ptr, sc_ptr, mc_ptr,  # the layout, as _gguf_linear_kernel's
    out_ptr,  # [N, K] in the output dtype
    N,
    K,
    stride_c,
    stride_h,
    stride_d,
    stride_s,
    stride_o,
    BITS: tl.constexpr,
    G: tl.constexpr,
    SUB: tl.constexpr,
    OFFSET: tl.constexpr,
    SUB_SCALES: tl.constexpr,
    HAS_MIN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GPI: tl.constexpr,
):
    KT: tl.constexpr = GPI * G
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_row = tl.minimum(rows, N - 1).to(tl.int64)  # rows past N read row N - 1, never stored
    k0 = tl.program_id(1) * KT
    q = _tile_codes(codes_ptr, high_ptr, w_row * stride_c, w_row * stride_h, k0, K, BLOCK_N, KT, BITS, "")
    s, b = _tile_scales(d_ptr, dm_ptr, sc_ptr, mc_ptr, w_row * stride_d, w_row * stride_s, k0, K, G, SUB,
                        GPI, SUB_SCALES, HAS_MIN)  # [GPI, BLOCK_N]
    w = tl.reshape((q - OFFSET).to(tl.float32), (BLOCK_N, GPI, G)) * tl.trans(s)[:, :, None]
    if HAS_MIN:
        w += tl.trans(b)[:, :, None]
    ck = k0 + tl.arange(0, KT)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + ck[None, :],
             tl.reshape(w, (BLOCK_N, KT)).to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (ck < K)[None, :])


def dequantize(w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:  # [N, K]
    """The weight in `dtype`: reference.dequantize's float32 values, rounded once."""
    fmt = w.fmt
    N, K = w.shape
    out = torch.empty(N, K, dtype=dtype, device=w.codes.device)
    block_n, gpi = 64, 4
    grid = (triton.cdiv(N, block_n), triton.cdiv(K, gpi * fmt.group))
    _dequantize_kernel[grid](
        w.codes, w.high, w.d, w.dm, w.sc, w.mc, out, N, K, w.codes.stride(0), max(1, w.high.stride(0)),
        w.d.stride(0), max(1, w.sc.stride(0)), out.stride(0),
        BITS=fmt.bits, G=fmt.group, SUB=fmt.sub, OFFSET=fmt.offset, SUB_SCALES=fmt.sub_scales,
        HAS_MIN=fmt.has_min, BLOCK_N=block_n, GPI=gpi, num_warps=4)
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
