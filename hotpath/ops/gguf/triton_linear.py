"""Linear over GGUF weights kept quantized (reference.py's layout), for every row count.

Few rows (decode, up to GEMV_MAX_ROWS): `_gguf_linear_kernel`. A program owns BLOCK_N output
features (virtual rows: weight rows, or gate/up pairs with GATED) for x's rows (padded to 16, a
dot's least; or up to 4 rows on FMAs), and walks its split of K a few scale groups an iteration
(their loads in one pipeline stage). Each group's codes are unpacked from their bit planes into
exact integers q - offset in x's dtype ([BLOCK_N, G]) and take one dot with x's columns (acc
[BLOCK_M, BLOCK_N] += x_g @ q_g^T, fp32), times the group's scale s, plus b times the sum of x's
columns of the group where the format has a min term. So the products are those of the exact
codes with x as it is, and the reference (dequantize in fp32, multiply in fp32) differs by
summation order only. K is split until the GPU is full (a counter's last program reduces the
splits), and the fused forms of the decode chain run in hotpath.ops.linear.triton_gemv's epilogue
(bias, silu(gate) * up, add into the residual with each tile's sums of squares).

More rows (prefill, large decode batches): `_dequantize_kernel` writes the weight in x's dtype
(fp32 dequantization rounded once: the 16-bit copy's very values) and the matmul is torch's
(cuBLAS on a GPU): at many rows the matmul's time dwarfs one pass over the weight.
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

GEMV_MAX_ROWS = 16  # rows up to which a call is one padded M tile with the fused forms
GEMV_PROGRAMS_PER_SM = 4


@dataclass(frozen=True)
class GGUFLinearConfig:
    block_m: int
    block_n: int  # virtual rows per program
    split_k: int  # programs along K (1: no split)
    num_warps: int
    num_stages: int
    groups: int = 1  # scale groups an iteration loads (the bytes each pipeline stage holds)
    use_dot: bool = True  # tensor cores (x's rows padded to block_m >= 16), else FMAs (few rows)


def choose_config(M: int, rows: int, K: int, group: int, device: torch.device) -> GGUFLinearConfig:
    """The few-rows kernel's tiles: 4 groups an iteration, 3 stages; the widest row tile (64, 32
    or 16 rows) that still gives two programs an SM, and K split only where the row tiles alone
    leave SMs idle: a split's reduction is a fixed cost, and splitting to four programs an SM left
    the 0.5B model's layers one iteration a program (docs/decisions.md)."""
    groups = 4
    sms = sm_count(device)
    block_n = next((b for b in (64, 32) if triton.cdiv(rows, b) >= 2 * sms), 16)
    n_tiles = triton.cdiv(rows, block_n)
    split = 1 if n_tiles >= sms else split_for(n_tiles, K, group * groups, device, GEMV_PROGRAMS_PER_SM)
    return GGUFLinearConfig(DOT_BLOCK_M, block_n, split, 4, 3, groups)


@triton.jit
def _group_codes(codes_ptr, high_ptr, c_rows, h_rows, k0, valid, BLOCK_N: tl.constexpr,
                 G: tl.constexpr, BITS: tl.constexpr, OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """The codes of columns k0 .. k0 + G of the rows at c_rows / h_rows (their offsets in the code
    and high-bit planes) minus OFFSET: [BLOCK_N, G] in DTYPE, exact integers (garbage where not
    `valid`: their scales load as 0)."""
    if BITS == 8:
        q = tl.load(codes_ptr + c_rows[:, None] + (k0 + tl.arange(0, G))[None, :], mask=valid).to(tl.int32)
    else:
        lo = tl.load(codes_ptr + c_rows[:, None] + (k0 // 2 + tl.arange(0, G // 2))[None, :], mask=valid)
        q = (lo.to(tl.int32)[:, :, None] >> (4 * tl.arange(0, 2))[None, None, :]) & 15
        q = tl.reshape(q, (BLOCK_N, G))  # [BLOCK_N, G / 2, 2] -> column 2j + i
        if BITS > 4:
            WIDTH: tl.constexpr = BITS - 4
            PER: tl.constexpr = 8 // WIDTH  # codes a high-plane byte
            hi = tl.load(high_ptr + h_rows[:, None] + (k0 // PER + tl.arange(0, G // PER))[None, :],
                         mask=valid)
            h = (hi.to(tl.int32)[:, :, None] >> (WIDTH * tl.arange(0, PER))[None, None, :]) & ((1 << WIDTH) - 1)
            q = q | (tl.reshape(h, (BLOCK_N, G)) << 4)
    return (q - OFFSET).to(DTYPE)


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
    groups_per_split,
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
    GROUPS: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_row = w_row.to(tl.int64)
    c_rows = w_row * stride_c
    h_rows = w_row * stride_h
    d_rows = w_row * stride_d
    s_rows = w_row * stride_s
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, G)
    dtype = x_ptr.dtype.element_ty
    g_start = pid_k * groups_per_split
    g_end = tl.minimum(g_start + groups_per_split, K // G)
    # (the weights are written by no kernel: their first loads could come before the wait, as
    # the int4 GEMV's do; not yet here)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(g_start, g_end, GROUPS):
        for j in tl.static_range(GROUPS):
            g = g0 + j
            # a split's last iteration may run past its groups ([1]: a mask the loads broadcast)
            valid = tl.full([1], g, tl.int32) < g_end
            k0 = g * G
            x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                        mask=(rm < M)[:, None] & valid, other=0.0)  # [BLOCK_M, G]
            if USE_DOT:
                q = _group_codes(codes_ptr, high_ptr, c_rows, h_rows, k0, valid, BLOCK_N, G, BITS,
                                 OFFSET, dtype)
                part = tl.dot(x, tl.trans(q), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
            else:  # one FMA a weight and row, in fp32
                q = _group_codes(codes_ptr, high_ptr, c_rows, h_rows, k0, valid, BLOCK_N, G, BITS,
                                 OFFSET, tl.float32)
                part = tl.sum(x.to(tl.float32)[:, None, :] * q[None, :, :], axis=2)
            s = tl.load(d_ptr + d_rows + g // SUB, mask=valid, other=0.0).to(tl.float32)
            if SUB_SCALES:
                s *= tl.load(sc_ptr + s_rows + g, mask=valid, other=0).to(tl.float32)
            acc += part * s[None, :]
            if HAS_MIN:
                b = tl.load(dm_ptr + d_rows + g // SUB, mask=valid, other=0.0).to(tl.float32)
                if SUB_SCALES:
                    b *= tl.load(mc_ptr + s_rows + g, mask=valid, other=0).to(tl.float32)
                acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * b[None, :]
    acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M]
    _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS, GATED, RESIDUAL, dtype,
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
    n_tiles = triton.cdiv(rows, cfg.block_n)
    assert M <= cfg.block_m and (cfg.use_dot or cfg.block_m <= 4), "one tile of x's rows (FMAs: up to 4)"
    groups = K // fmt.group
    # a split's groups: whole iterations of cfg.groups but the last split's
    per_split = triton.cdiv(triton.cdiv(groups, max(1, min(cfg.split_k, groups))), cfg.groups) * cfg.groups
    split = triton.cdiv(groups, per_split)
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
        GROUPS=cfg.groups,
        USE_DOT=cfg.use_dot,
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
    GROUPS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_row = tl.minimum(rows, N - 1).to(tl.int64)  # rows past N read row N - 1, never stored
    rk = tl.arange(0, G)
    for j in tl.static_range(GROUPS):
        g = tl.program_id(1) * GROUPS + j
        valid = tl.full([1], g, tl.int32) < K // G
        q = _group_codes(codes_ptr, high_ptr, w_row * stride_c, w_row * stride_h, g * G, valid,
                         BLOCK_N, G, BITS, OFFSET, tl.float32)
        s = tl.load(d_ptr + w_row * stride_d + g // SUB, mask=valid, other=0.0).to(tl.float32)
        if SUB_SCALES:
            s *= tl.load(sc_ptr + w_row * stride_s + g, mask=valid, other=0).to(tl.float32)
        w = q * s[:, None]
        if HAS_MIN:
            b = tl.load(dm_ptr + w_row * stride_d + g // SUB, mask=valid, other=0.0).to(tl.float32)
            if SUB_SCALES:
                b *= tl.load(mc_ptr + w_row * stride_s + g, mask=valid, other=0).to(tl.float32)
            w += b[:, None]
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + (g * G + rk)[None, :],
                 w.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & valid)


def dequantize(w: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:  # [N, K]
    """The weight in `dtype`: reference.dequantize's float32 values, rounded once."""
    fmt = w.fmt
    N, K = w.shape
    out = torch.empty(N, K, dtype=dtype, device=w.codes.device)
    block_n, groups = 64, 4
    grid = (triton.cdiv(N, block_n), triton.cdiv(K // fmt.group, groups))
    _dequantize_kernel[grid](
        w.codes, w.high, w.d, w.dm, w.sc, w.mc, out, N, K, w.codes.stride(0), max(1, w.high.stride(0)),
        w.d.stride(0), max(1, w.sc.stride(0)), out.stride(0),
        BITS=fmt.bits, G=fmt.group, SUB=fmt.sub, OFFSET=fmt.offset, SUB_SCALES=fmt.sub_scales,
        HAS_MIN=fmt.has_min, BLOCK_N=block_n, GROUPS=groups, num_warps=4)
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
