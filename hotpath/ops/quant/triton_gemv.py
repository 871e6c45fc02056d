"""Linear for one or two rows (decode at batch 1-2) over fp8 weights: out = x @ W^T (+ bias),
W dequantized in registers from fp8 with per-channel or 128x128-block scales; x stays in its own
dtype. From 3 rows x is quantized and the fp8 x fp8 GEMM runs (triton_gemm; FP8_GEMV_MAX_ROWS).

The kernel is hotpath.ops.linear.triton_gemv's FMA path with the weight's format as a constexpr
(WFMT), and it shares that kernel's epilogue and fused forms (`_store_out`, `_rstd`,
`_normed_x`): the input RMS-normalised as it loads (NORM_INPUT), gate and up rows paired so that a
program forms silu(gate) * up (GATED), the output added into the residual stream with each N
tile's sums of squares stored for the next projection (RESIDUAL), PDL with the first weight tile
(and its scales) loading before the wait, weight loads evicted first. What a program does:

- it owns BLOCK_N output features (virtual rows: weight rows, or gate/up pairs) and all of K, and
  walks K in BLOCK_K tiles (no K split: the last-arriver reduction of the 16-bit kernel is left
  out, so a weight with few rows and a long K has few programs);
- each row of x multiplies the tile element-wise in fp32, summed along K; the scales are applied
  per segment of the tile, not per element: per-channel once in the epilogue, block per
  128-column segment (sum of w * x over the segment, times its scale).

The tiles come from `choose_config`, a fixed rule of the shape (capturable in a CUDA graph),
from benchmarks/tune_quant_fp8.py's sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.linear.triton_gemv import _normed_x, _rstd, _store_out, _virtual_rows, gemv_io
from hotpath.ops.quant import reference
from hotpath.ops.quant.reference import FP8_GEMV_MAX_ROWS, BlockSize
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait

# weight formats (the WFMT constexpr)
FP8_CHANNEL, FP8_BLOCK = 0, 1
# one tile holds all of K up to this many elements (32 KB of weight for 8 rows)
WHOLE_K = 4096


@dataclass(frozen=True)
class QuantGemvConfig:
    block_n: int  # virtual rows per program
    block_k: int  # K elements per tile (a power of 2)
    num_warps: int


def choose_config(M: int, K: int) -> QuantGemvConfig:
    """Tiles for M (1 or 2) rows: 8 rows x all of K up to 4096 columns at one row (4 at two),
    4096-wide tiles walked where K is a multiple, else 1024; 4 warps (faster than 8)."""
    if K <= WHOLE_K:
        block_k = max(16, triton.next_power_of_2(K))
    elif K % WHOLE_K == 0:
        block_k = WHOLE_K
    else:
        block_k = 1024
    return QuantGemvConfig(8 if M == 1 else 4, block_k, 4)


@triton.jit
def _load_tile(w_rows, k0, K, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr):
    """The fp8 tile [BLOCK_N, BLOCK_K] at columns k0..k0 + BLOCK_K of rows w_rows ([BLOCK_N, 1]
    pointers)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        return tl.load(w_rows + rk[None, :], eviction_policy=EVICT)
    # the fill as a float (the interpreter cannot cast an integer fill to fp8)
    return tl.load(w_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0, eviction_policy=EVICT)


@triton.jit
def _load_scales(scale_ptr, w_row, k0, K, stride_sn, WFMT: tl.constexpr, GROUP: tl.constexpr,
                 GROUP_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The block scales fp32 [BLOCK_N, BLOCK_K / SEG] of the tile at k0 for the weight rows w_row
    [BLOCK_N], a segment being SEG = min(BLOCK_K, GROUP) columns; 1 for per-channel weights (their
    scale is applied in the epilogue)."""
    if WFMT == 0:
        s = 1.0
    else:
        SEG: tl.constexpr = min(BLOCK_K, GROUP)
        seg = (k0 + tl.arange(0, BLOCK_K // SEG) * SEG) // GROUP
        offs = (w_row // GROUP_N)[:, None].to(tl.int64) * stride_sn + seg[None, :]
        s = tl.load(scale_ptr + offs, mask=(seg < tl.cdiv(K, GROUP))[None, :], other=0.0)
    return s


@triton.jit
def _fma_row(w, s, x_row, k0, K, norm_w_ptr, rstd, WFMT: tl.constexpr, GROUP: tl.constexpr,
             EVEN_K: tl.constexpr, NORM_INPUT: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N] fp32: one row of x times the dequantized tile, summed along K (per-channel:
    without its scale)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        x = tl.load(x_row + rk)
    else:
        x = tl.load(x_row + rk, mask=rk < K, other=0.0)
    if NORM_INPUT:
        x = _normed_x(x, rk, norm_w_ptr, rstd, K, EVEN_K)
    x = x.to(tl.float32)
    if WFMT == 0:
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    else:
        BLOCK_N: tl.constexpr = w.shape[0]
        SEG: tl.constexpr = min(BLOCK_K, GROUP)
        p = tl.reshape(w.to(tl.float32) * x[None, :], (BLOCK_N, BLOCK_K // SEG, SEG))
        acc = tl.sum(tl.sum(p, axis=2) * s, axis=1)
    return acc


@triton.jit
def _fma_rows(w, s, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, WFMT: tl.constexpr,
              GROUP: tl.constexpr, EVEN_K: tl.constexpr, NORM_INPUT: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_M] fp32: _fma_row for each of x's rows (rows past M read row M - 1)."""
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([w.shape[0], BLOCK_M], dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        r = tl.sum(tl.where(rm == m, rstd, 0.0)) if NORM_INPUT else rstd
        a = _fma_row(w, s, x_ptr + tl.minimum(m, M - 1) * stride_xm, k0, K, norm_w_ptr, r, WFMT,
                     GROUP, EVEN_K, NORM_INPUT, BLOCK_K)
        acc += tl.where(rm[None, :] == m, a[:, None], 0.0)
    return acc


@triton.jit(do_not_specialize=["M", "N"])
def _fp8_gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # fp8 [rows, K]; rows = N (2N = [gate | up] with GATED)
    scale_ptr,  # fp32 [rows] (per channel) / [rows / GROUP_N, K / GROUP] (block)
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]; with RESIDUAL the residual stream, updated in place
    norm_w_ptr,  # [K] (NORM_INPUT)
    stat_in_ptr,  # [n_stat_in, M] fp32 (NORM_INPUT)
    n_stat_in,
    eps,
    stat_ptr,  # [n_tiles, M] fp32 (RESIDUAL)
    M,
    N,  # output features
    K,
    stride_xm,
    stride_wn,
    stride_sn,  # the block scales' row stride
    stride_om,
    WFMT: tl.constexpr,  # FP8_CHANNEL, FP8_BLOCK
    GROUP: tl.constexpr,  # columns a block scale covers (1: per channel)
    GROUP_N: tl.constexpr,  # rows a block scale covers
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    NORM_INPUT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    W_EVICT: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    _, w_row, _ = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    w_rows = w_ptr + w_row.to(tl.int64)[:, None] * stride_wn
    rm = tl.arange(0, BLOCK_M)
    # the weights and their scales are not written by any kernel: read before the wait
    w = _load_tile(w_rows, 0, K, EVEN_K, BLOCK_K, W_EVICT)
    s = _load_scales(scale_ptr, w_row, 0, K, stride_sn, WFMT, GROUP, GROUP_N, BLOCK_K)
    if WFMT == 0:
        channel_scale = tl.load(scale_ptr + w_row)
    pdl_wait(USE_PDL)
    rstd = _rstd(stat_in_ptr, n_stat_in, rm, M, K, eps, 1024) if NORM_INPUT else 1.0
    acc = _fma_rows(w, s, x_ptr, stride_xm, M, 0, K, norm_w_ptr, rstd, WFMT, GROUP, EVEN_K,
                    NORM_INPUT, BLOCK_M, BLOCK_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        wk = _load_tile(w_rows, k0, K, EVEN_K, BLOCK_K, W_EVICT)
        sk = _load_scales(scale_ptr, w_row, k0, K, stride_sn, WFMT, GROUP, GROUP_N, BLOCK_K)
        acc += _fma_rows(wk, sk, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, WFMT, GROUP,
                         EVEN_K, NORM_INPUT, BLOCK_M, BLOCK_K)
    if WFMT == 0:
        acc = acc * channel_scale[:, None]
    _store_out(out_ptr, bias_ptr, acc, pid_n, rm, N, M, stride_om, stat_ptr, HAS_BIAS, GATED,
               RESIDUAL, x_ptr.dtype.element_ty, BLOCK_N)


# ---- host side ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Weight:
    """An fp8 weight as the kernels read it."""
    wfmt: int
    data: torch.Tensor  # fp8 [rows, K]
    scale: torch.Tensor  # fp32 [rows] or [rows / group_n, K / group]
    group: int  # see the kernel's GROUP
    group_n: int
    rows: int
    K: int


def _pow2(value: int, what: str) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{what} must be a power of 2 of at least 16 for the Triton kernels, got {value}")


def fp8_weight(weight: torch.Tensor, scale: torch.Tensor, block_size: BlockSize | None) -> _Weight:
    rows, K = weight.shape
    if weight.stride(1) != 1:
        raise ValueError("the fp8 weight must be contiguous along in_features")
    if block_size is None:
        scale = reference.per_channel_scale(scale, rows).contiguous()
        return _Weight(FP8_CHANNEL, weight, scale, 1, 1, rows, K)
    reference.check_block_scale(scale, rows, K, block_size)
    _pow2(block_size[0], "block_n")
    _pow2(block_size[1], "block_k")
    return _Weight(FP8_BLOCK, weight, scale.float().contiguous(), block_size[1], block_size[0], rows, K)


def _launch(x: torch.Tensor, w: _Weight, bias: torch.Tensor | None, config: QuantGemvConfig | None,
            gated: bool = False, rms: RmsInput | None = None,
            residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    io = gemv_io(x, w.rows, w.K, bias, gated, rms, residual, out_dtype, FP8_GEMV_MAX_ROWS,
                 "the fp8 GEMV")
    if io.done:
        return io.out.view(*x.shape[:-1], io.N), None
    x2, out, M, N, K = io.x2, io.out, io.M, io.N, w.K
    cfg = config or choose_config(M, K)
    n_tiles = triton.cdiv(w.rows, cfg.block_n)
    stat = torch.empty((n_tiles, M), dtype=torch.float32, device=x.device) if residual is not None else None
    use_pdl = pdl_enabled(x.device)
    _fp8_gemv_kernel[(n_tiles,)](
        x2, w.data, w.scale, bias if bias is not None else out, out, io.norm_w, io.stat_in,
        io.stat_in.shape[0], io.eps, stat if stat is not None else out,
        M, N, K, x2.stride(0), w.data.stride(0), w.scale.stride(0) if w.scale.dim() == 2 else 1,
        out.stride(0),
        WFMT=w.wfmt,
        GROUP=w.group,
        GROUP_N=w.group_n,
        HAS_BIAS=bias is not None,
        GATED=gated,
        NORM_INPUT=rms is not None,
        RESIDUAL=residual is not None,
        EVEN_K=K % cfg.block_k == 0,
        USE_PDL=use_pdl,
        BLOCK_M=triton.next_power_of_2(M),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        W_EVICT="evict_first",
        num_warps=cfg.num_warps,
        **pdl_launch(use_pdl),
    )
    return out.view(*x.shape[:-1], N), stat


# ---- the ops (the package's dispatch calls these for up to FP8_GEMV_MAX_ROWS rows) --------------
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               block_size: BlockSize | None, bias: torch.Tensor | None = None,
               rms: RmsInput | None = None, out_dtype: torch.dtype | None = None,
               config: QuantGemvConfig | None = None) -> torch.Tensor:  # [..., N]
    return _launch(x, fp8_weight(weight, weight_scale, block_size), bias, config, rms=rms,
                   out_dtype=out_dtype)[0]


def fp8_linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            block_size: BlockSize | None, rms: RmsInput | None = None,
                            config: QuantGemvConfig | None = None) -> torch.Tensor:  # [..., N / 2]
    return _launch(x, fp8_weight(weight, weight_scale, block_size), None, config, gated=True,
                   rms=rms)[0]


def fp8_linear_add_residual(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            block_size: BlockSize | None, residual: torch.Tensor,
                            config: QuantGemvConfig | None = None) -> torch.Tensor:  # [T, M] fp32
    return _launch(x, fp8_weight(weight, weight_scale, block_size), None, config,
                   residual=residual)[1]
