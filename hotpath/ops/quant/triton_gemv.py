"""Linear for a few rows (decode at batch 1..16) over quantized weights: out = x @ W^T (+ bias),
W dequantized in registers from fp8 (per-channel or 128x128-block scales) or int4 (groups of G
columns with zero points, optionally GPTQ's g_idx). x stays in its own dtype.

The kernel is hotpath.ops.linear.triton_gemv's, with the weight's format as a constexpr (WFMT),
and it shares that kernel's epilogue and fused forms (`_store_out`, `_rstd`, `_normed_x`): the
input RMS-normalised as it loads (NORM_INPUT), gate and up rows paired so that a program forms
silu(gate) * up (GATED), the output added into the residual stream with each N tile's sums of
squares stored for the next projection (RESIDUAL), PDL with the first weight tile (and its
scales) loading before the wait, weight loads evicted first. What a program does:

- it owns BLOCK_N output features (virtual rows: weight rows, or gate/up pairs) and all of K, and
  walks K in BLOCK_K tiles (no K split: the last-arriver reduction of the 16-bit kernel is left
  out, so a weight with few rows and a long K has few programs);
- one or two rows (FMA path): the tile is multiplied by x element-wise in fp32 and summed; the
  scales are applied per segment of the tile, not per element: fp8 per-channel once in the
  epilogue; fp8 block per 128-column segment (sum of w * x over the segment, times its scale);
  int4 as s * (sum(q * x) - z * sum(x)) per group segment, so a nibble costs a shift, a mask, a
  conversion and an FMA. With g_idx the scale and zero are gathered per element;
- 3..16 rows (tensor cores): x's rows padded to 16, acc[BLOCK_N, 16] += w @ x^T, the tile
  converted to x's dtype exactly (fp8 values and the integers q - z are exact in 16 bits) and
  the tile's scale multiplied into its dot's result (BLOCK_K within one scale block or group); with
  g_idx the tile is dequantized per element and rounded to x's dtype before the dot.

The tiles come from `choose_config`, a fixed rule of the shape (capturable in a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.linear.triton_gemv import DOT_BLOCK_M, _normed_x, _rstd, _store_out
from hotpath.ops.quant import reference
from hotpath.ops.quant.reference import BlockSize
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait, sm_count

# weight formats (the WFMT constexpr)
FP8_CHANNEL, FP8_BLOCK, INT4 = 0, 1, 2
# rows summed with FMAs (each row's products take registers of their own); more use tensor cores
FMA_MAX_ROWS = 2
# one tile holds all of K up to this many elements (fp8: 32 KB of weight for 8 rows; int4: 16 KB)
WHOLE_K = {FP8_CHANNEL: 4096, FP8_BLOCK: 4096, INT4: 4096}


@dataclass(frozen=True)
class QuantGemvConfig:
    block_n: int  # virtual rows per program
    block_k: int  # K elements per tile (a power of 2)
    num_warps: int
    num_stages: int
    use_dot: bool
    block_m: int = 0  # x's rows per dot tile (0: DOT_BLOCK_M, or M's power of 2 on the FMA path)


def choose_config(M: int, N: int, K: int, wfmt: int, group: int, device: torch.device,
                  gidx: bool = False) -> QuantGemvConfig:
    """Tiles for M rows of an [N, K] weight; `group` is the scale block's width along K (fp8
    block) or the int4 group (0: per-channel fp8). Not measured yet: the 16-bit kernel's rules
    (8 x all-of-K tiles at one row, 1024-wide tiles walked where K is long and not a multiple of
    4096), with the tensor-core tile along K held to one scale group."""
    if M <= FMA_MAX_ROWS:
        block_n = 8 if M == 1 else 4
        whole = WHOLE_K[wfmt]
        if K <= whole:
            block_k = max(16, triton.next_power_of_2(K))
        elif K % whole == 0:
            block_k = whole
        else:
            block_k = 1024
        if gidx:
            # the gathered scales and zeros of a wider tile spilled (sm90, 4096: 488 bytes)
            block_k = min(block_k, 512)
        # fp8: 4 warps (H200, Qwen3-8B's gate_up at one row: 25.7 us, 3,950 GB/s, against 28.9
        # at 8 warps; benchmarks/tune_quant_fp8.py)
        num_warps = 8 if wfmt == INT4 and block_k >= 2048 else 4
        return QuantGemvConfig(block_n, block_k, num_warps, 1, False)
    block_n = 32 if triton.cdiv(N, 32) >= 2 * sm_count(device) else 16
    if not group:
        return QuantGemvConfig(block_n, 256, 4, 2, True)
    # a tile within one scale group; unpipelined: gfx950's pipeliner failed to lower the RMS
    # prologue's [1, 128] norm-weight load as a direct-to-LDS copy at 2 stages (at 256 it did)
    return QuantGemvConfig(block_n, max(16, min(128, group)), 4, 1, True)


@triton.jit
def _load_tile(w_rows, k0, K, WFMT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr,
               EVICT: tl.constexpr):
    """The stored tile at columns k0..k0 + BLOCK_K of rows w_rows ([BLOCK_N, 1] pointers):
    fp8 [BLOCK_N, BLOCK_K], or int4 words [BLOCK_N, BLOCK_K / 8]."""
    if WFMT == 2:
        rw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        mask = (rw < K // 8)[None, :]
    else:
        rw = k0 + tl.arange(0, BLOCK_K)
        mask = (rw < K)[None, :]
    if EVEN_K:
        return tl.load(w_rows + rw[None, :], eviction_policy=EVICT)
    # the fill as a float for fp8 (the interpreter cannot cast an integer fill to fp8)
    return tl.load(w_rows + rw[None, :], mask=mask, other=0 if WFMT == 2 else 0.0,
                   eviction_policy=EVICT)


@triton.jit
def _load_scales(scale_ptr, zero_ptr, gidx_ptr, w_row, k0, K, stride_sn,
                 WFMT: tl.constexpr, HAS_GIDX: tl.constexpr, GROUP: tl.constexpr,
                 GROUP_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(scales, zeros) fp32 of the tile at k0 for the weight rows w_row [BLOCK_N]: per segment
    of SEG = min(BLOCK_K, GROUP) columns [BLOCK_N, BLOCK_K / SEG] (fp8 block, int4), or with
    g_idx per element [BLOCK_N, BLOCK_K / 8, 8]. fp8 per-channel: (1, 0) (its scale is applied
    in the epilogue); zeros are 0 for fp8."""
    if WFMT == 0:
        s = 1.0
        z = 0.0
    elif HAS_GIDX:
        rk = k0 + tl.arange(0, BLOCK_K // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
        g = tl.load(gidx_ptr + rk, mask=rk < K, other=0)
        offs = w_row[:, None, None].to(tl.int64) * stride_sn + g[None, :, :]
        s = tl.load(scale_ptr + offs).to(tl.float32)
        z = tl.load(zero_ptr + offs).to(tl.float32)
    else:
        SEG: tl.constexpr = min(BLOCK_K, GROUP)
        seg = (k0 + tl.arange(0, BLOCK_K // SEG) * SEG) // GROUP
        mask = (seg < tl.cdiv(K, GROUP))[None, :]
        if WFMT == 1:
            offs = (w_row // GROUP_N)[:, None].to(tl.int64) * stride_sn + seg[None, :]
            s = tl.load(scale_ptr + offs, mask=mask, other=0.0)
            z = 0.0
        else:
            offs = w_row[:, None].to(tl.int64) * stride_sn + seg[None, :]
            s = tl.load(scale_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(zero_ptr + offs, mask=mask, other=0).to(tl.float32)
    return s, z


@triton.jit
def _nibbles(words):
    """int32 words [BLOCK_N, W] -> their nibbles [BLOCK_N, W, 8] as fp32, nibble j of word w
    being column 8w + j."""
    shifts = tl.arange(0, 8) * 4
    return ((words[:, :, None] >> shifts[None, None, :]) & 0xF).to(tl.float32)


@triton.jit
def _fma_row(w, s, z, x_row, k0, K, norm_w_ptr, rstd, WFMT: tl.constexpr, HAS_GIDX: tl.constexpr,
             GROUP: tl.constexpr, EVEN_K: tl.constexpr, NORM_INPUT: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """[BLOCK_N] fp32: one row of x times the dequantized tile, summed along K (fp8
    per-channel: without its scale)."""
    if WFMT == 2:
        rk = k0 + tl.arange(0, BLOCK_K // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BK/8, 8]
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        x = tl.load(x_row + rk)
    else:
        x = tl.load(x_row + rk, mask=rk < K, other=0.0)
    if NORM_INPUT:
        x = _normed_x(x, rk, norm_w_ptr, rstd, K, EVEN_K)
    x = x.to(tl.float32)
    BLOCK_N: tl.constexpr = w.shape[0]
    if WFMT == 0:
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    elif WFMT == 1:
        SEG: tl.constexpr = min(BLOCK_K, GROUP)
        p = tl.reshape(w.to(tl.float32) * x[None, :], (BLOCK_N, BLOCK_K // SEG, SEG))
        acc = tl.sum(tl.sum(p, axis=2) * s, axis=1)
    elif HAS_GIDX:
        q = _nibbles(w)
        acc = tl.sum(tl.sum((q - z) * s * x[None, :, :], axis=2), axis=1)
    else:
        SEG: tl.constexpr = min(BLOCK_K, GROUP)
        qx = tl.sum(_nibbles(w) * x[None, :, :], axis=2)  # [BLOCK_N, BLOCK_K / 8]
        qx = tl.sum(tl.reshape(qx, (BLOCK_N, BLOCK_K // SEG, SEG // 8)), axis=2)
        xs = tl.sum(tl.reshape(x, (BLOCK_K // SEG, SEG)), axis=1)  # each segment's sum of x
        acc = tl.sum((qx - z * xs[None, :]) * s, axis=1)
    return acc


@triton.jit
def _fma_rows(w, s, z, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, WFMT: tl.constexpr,
              HAS_GIDX: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
              NORM_INPUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_M] fp32: _fma_row for each of x's rows (rows past M read row M - 1)."""
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([w.shape[0], BLOCK_M], dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        r = tl.sum(tl.where(rm == m, rstd, 0.0)) if NORM_INPUT else rstd
        a = _fma_row(w, s, z, x_ptr + tl.minimum(m, M - 1) * stride_xm, k0, K, norm_w_ptr, r,
                     WFMT, HAS_GIDX, GROUP, EVEN_K, NORM_INPUT, BLOCK_K)
        acc += tl.where(rm[None, :] == m, a[:, None], 0.0)
    return acc


@triton.jit
def _dot_tile(w, s, z, xt, acc, WFMT: tl.constexpr, HAS_GIDX: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += dequantized tile @ xt ([BLOCK_K, BLOCK_M] in x's dtype)."""
    dtype = xt.dtype
    if WFMT == 0:
        acc = tl.dot(w.to(dtype), xt, acc, input_precision=DOT_PRECISION)
    elif WFMT == 1:
        acc += tl.dot(w.to(dtype), xt, input_precision=DOT_PRECISION) * s
    else:
        BLOCK_N: tl.constexpr = w.shape[0]
        BLOCK_K: tl.constexpr = w.shape[1] * 8
        if HAS_GIDX:
            wq = tl.reshape((_nibbles(w) - z) * s, (BLOCK_N, BLOCK_K)).to(dtype)
            acc = tl.dot(wq, xt, acc, input_precision=DOT_PRECISION)
        else:
            # q - z is an integer in [-15, 15]: exact in any float dtype; the scale after the dot
            wq = tl.reshape(_nibbles(w) - z[:, :, None], (BLOCK_N, BLOCK_K)).to(dtype)
            acc += tl.dot(wq, xt, input_precision=DOT_PRECISION) * s
    return acc


@triton.jit
def _dot_step(w, s, z, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, acc, WFMT: tl.constexpr,
              HAS_GIDX: tl.constexpr, EVEN_K: tl.constexpr, NORM_INPUT: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += the tile at k0 times x's rows there (transposed, [BLOCK_K, BLOCK_M], rows past M
    zero), x RMS-normalised as it loads (NORM_INPUT)."""
    rm = tl.arange(0, BLOCK_M)
    rk = k0 + tl.arange(0, BLOCK_K)
    x_mask = (rm < M)[:, None]
    if not EVEN_K:
        x_mask = x_mask & (rk < K)[None, :]
    # loaded [BLOCK_M, BLOCK_K] and transposed, as the 16-bit kernel does: a [BLOCK_K, 1] load of
    # the norm weight failed gfx950's direct-to-LDS pipelining
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=x_mask, other=0.0)
    if NORM_INPUT:
        x = _normed_x(x, rk[None, :], norm_w_ptr, rstd, K, EVEN_K)
    return _dot_tile(w, s, z, tl.trans(x), acc, WFMT, HAS_GIDX, DOT_PRECISION)


@triton.jit(do_not_specialize=["M", "N"])
def _quant_gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # fp8 [rows, K] or int32 [rows, K / 8]; rows = N (2N = [gate | up] with GATED)
    scale_ptr,  # fp32 [rows] (fp8 per-channel) / [rows / GROUP_N, K / GROUP] (fp8 block); [rows, K / G] (int4)
    zero_ptr,  # uint8 [rows, K / G] (int4)
    gidx_ptr,  # int32 [K] (int4 with HAS_GIDX)
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
    stride_sn,  # the scales' (and zeros') row stride
    stride_om,
    WFMT: tl.constexpr,  # FP8_CHANNEL, FP8_BLOCK, INT4
    HAS_GIDX: tl.constexpr,
    GROUP: tl.constexpr,  # columns a scale covers (fp8 block: block_k; int4: G); 1 unused
    GROUP_N: tl.constexpr,  # rows a scale covers (fp8 block: block_n)
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    NORM_INPUT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    USE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    W_EVICT: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    rv = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if GATED:
        w_row = tl.minimum(rv // 2, N - 1) + (rv % 2) * N
    else:
        w_row = tl.minimum(rv, N - 1)
    w_rows = w_ptr + w_row.to(tl.int64)[:, None] * stride_wn
    rm = tl.arange(0, BLOCK_M)
    # the weights and their scales are not written by any kernel: read before the wait
    w = _load_tile(w_rows, 0, K, WFMT, EVEN_K, BLOCK_K, W_EVICT)
    s, z = _load_scales(scale_ptr, zero_ptr, gidx_ptr, w_row, 0, K, stride_sn, WFMT, HAS_GIDX,
                        GROUP, GROUP_N, BLOCK_K)
    if WFMT == 0:
        channel_scale = tl.load(scale_ptr + w_row)
    pdl_wait(USE_PDL)
    if USE_DOT:
        rstd = _rstd(stat_in_ptr, n_stat_in, rm, M, K, eps, 64)[:, None] if NORM_INPUT else 1.0
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc = _dot_step(w, s, z, x_ptr, stride_xm, M, 0, K, norm_w_ptr, rstd, acc, WFMT,
                        HAS_GIDX, EVEN_K, NORM_INPUT, BLOCK_M, BLOCK_K, DOT_PRECISION)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            wk = _load_tile(w_rows, k0, K, WFMT, EVEN_K, BLOCK_K, "")
            sk, zk = _load_scales(scale_ptr, zero_ptr, gidx_ptr, w_row, k0, K, stride_sn, WFMT,
                                  HAS_GIDX, GROUP, GROUP_N, BLOCK_K)
            acc = _dot_step(wk, sk, zk, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, acc, WFMT,
                            HAS_GIDX, EVEN_K, NORM_INPUT, BLOCK_M, BLOCK_K, DOT_PRECISION)
    else:
        rstd = _rstd(stat_in_ptr, n_stat_in, rm, M, K, eps, 1024) if NORM_INPUT else 1.0
        acc = _fma_rows(w, s, z, x_ptr, stride_xm, M, 0, K, norm_w_ptr, rstd, WFMT, HAS_GIDX,
                        GROUP, EVEN_K, NORM_INPUT, BLOCK_M, BLOCK_K)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            wk = _load_tile(w_rows, k0, K, WFMT, EVEN_K, BLOCK_K, W_EVICT)
            sk, zk = _load_scales(scale_ptr, zero_ptr, gidx_ptr, w_row, k0, K, stride_sn, WFMT,
                                  HAS_GIDX, GROUP, GROUP_N, BLOCK_K)
            acc += _fma_rows(wk, sk, zk, x_ptr, stride_xm, M, k0, K, norm_w_ptr, rstd, WFMT,
                             HAS_GIDX, GROUP, EVEN_K, NORM_INPUT, BLOCK_M, BLOCK_K)
    if WFMT == 0:
        acc = acc * channel_scale[:, None]
    _store_out(out_ptr, bias_ptr, acc, pid_n, rm, N, M, stride_om, stat_ptr, HAS_BIAS, GATED,
               RESIDUAL, x_ptr.dtype.element_ty, BLOCK_N)


# ---- host side ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Weight:
    """A quantized weight as the kernel reads it."""
    wfmt: int
    data: torch.Tensor  # fp8 [rows, K] or int32 [rows, K / 8]
    scale: torch.Tensor
    zeros: torch.Tensor | None
    g_idx: torch.Tensor | None
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
        return _Weight(FP8_CHANNEL, weight, scale, None, None, 1, 1, rows, K)
    reference.check_block_scale(scale, rows, K, block_size)
    _pow2(block_size[0], "block_n")
    _pow2(block_size[1], "block_k")
    scale = scale.float().contiguous()
    return _Weight(FP8_BLOCK, weight, scale, None, None, block_size[1], block_size[0], rows, K)


def int4_weight(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
                g_idx: torch.Tensor | None) -> _Weight:
    rows, K = qweight.shape[0], 8 * qweight.shape[1]
    if qweight.dtype != torch.int32 or qweight.stride(1) != 1:
        raise ValueError("qweight must be a row-major int32 [N, K / 8]")
    if scales.shape != qzeros.shape or scales.shape[0] != rows or qzeros.dtype != torch.uint8:
        raise ValueError(f"scales {tuple(scales.shape)} and qzeros ({qzeros.dtype}) "
                         f"{tuple(qzeros.shape)} must both be [{rows}, groups], qzeros uint8")
    if g_idx is None:
        _pow2(group_size, "the int4 group size")
        if scales.shape[1] != triton.cdiv(K, group_size):
            raise ValueError(f"{K} columns in groups of {group_size} take {triton.cdiv(K, group_size)} "
                             f"scales a row, got {scales.shape[1]}")
    else:
        if g_idx.shape != (K,):
            raise ValueError(f"g_idx must have shape ({K},), got {tuple(g_idx.shape)}")
        g_idx = g_idx.to(torch.int32).contiguous()
        group_size = 128  # only the tensor-core tile's width: scales are gathered per column
    scales, qzeros = scales.contiguous(), qzeros.contiguous()
    return _Weight(INT4, qweight, scales, qzeros, g_idx, group_size, 1, rows, K)


def _launch(x: torch.Tensor, w: _Weight, bias: torch.Tensor | None, config: QuantGemvConfig | None,
            gated: bool = False, rms: RmsInput | None = None,
            residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    K = x.shape[-1]
    rows = w.rows
    N = rows // 2 if gated else rows
    if w.K != K:
        raise ValueError(f"x has {K} features but the weight has {w.K}")
    if gated and rows % 2:
        raise ValueError(f"a [gate | up] weight needs an even number of rows, got {rows}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if residual is not None:
        if residual.shape != (M, N) or residual.stride(-1) != 1:
            raise ValueError(f"residual {tuple(residual.shape)} must be a row-major [{M}, {N}]")
        out = residual
    else:
        out = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)  # [M, N]
    if M == 0 or N == 0 or K == 0:
        assert residual is None and rms is None, "the fused forms are for real projections"
        out.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(out))
        return out.view(*x.shape[:-1], N), None
    cfg = config or choose_config(M, rows, K, w.wfmt, w.group if w.wfmt != FP8_CHANNEL else 0,
                                  x.device, w.g_idx is not None)
    block_m = cfg.block_m or (DOT_BLOCK_M if cfg.use_dot else triton.next_power_of_2(M))
    if M > block_m or (not cfg.use_dot and M > FMA_MAX_ROWS * 2):
        raise ValueError(f"the quantized GEMV takes at most {block_m} rows with this config, got {M}")
    if cfg.use_dot and w.wfmt != FP8_CHANNEL and w.g_idx is None and cfg.block_k > w.group:
        raise ValueError(f"a tensor-core tile of {cfg.block_k} columns spans several scale groups of {w.group}")
    n_tiles = triton.cdiv(rows, cfg.block_n)
    stat = torch.empty((n_tiles, M), dtype=torch.float32, device=x.device) if residual is not None else None
    if rms is not None:
        stat_in, norm_w, eps = rms
        if stat_in.dim() != 2 or stat_in.shape[1] != M or stat_in.dtype != torch.float32:
            raise ValueError(f"rms statistic must be fp32 [T, {M}], got {stat_in.dtype} {tuple(stat_in.shape)}")
        stat_in = stat_in.contiguous()
    else:
        stat_in, norm_w, eps = out, out, 0.0
    use_pdl = pdl_enabled(x.device)
    _quant_gemv_kernel[(n_tiles,)](
        x2, w.data, w.scale, w.zeros if w.zeros is not None else w.scale,
        w.g_idx if w.g_idx is not None else w.scale,
        bias if bias is not None else out, out, norm_w, stat_in, stat_in.shape[0], eps,
        stat if stat is not None else out,
        M, N, K, x2.stride(0), w.data.stride(0), w.scale.stride(0) if w.scale.dim() == 2 else 1,
        out.stride(0),
        WFMT=w.wfmt,
        HAS_GIDX=w.g_idx is not None,
        GROUP=w.group,
        GROUP_N=w.group_n,
        HAS_BIAS=bias is not None,
        GATED=gated,
        NORM_INPUT=rms is not None,
        RESIDUAL=residual is not None,
        USE_DOT=cfg.use_dot,
        EVEN_K=K % cfg.block_k == 0,
        USE_PDL=use_pdl,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        W_EVICT="evict_first",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )
    return out.view(*x.shape[:-1], N), stat


# ---- the ops (the package's dispatch calls these for up to GEMV_MAX_ROWS rows) ------------------
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


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                group_size: int, g_idx: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                rms: RmsInput | None = None, out_dtype: torch.dtype | None = None,
                config: QuantGemvConfig | None = None) -> torch.Tensor:  # [..., N]
    return _launch(x, int4_weight(qweight, scales, qzeros, group_size, g_idx), bias, config,
                   rms=rms, out_dtype=out_dtype)[0]


def int4_linear_silu_and_mul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                             qzeros: torch.Tensor, group_size: int, g_idx: torch.Tensor | None = None,
                             rms: RmsInput | None = None,
                             config: QuantGemvConfig | None = None) -> torch.Tensor:
    return _launch(x, int4_weight(qweight, scales, qzeros, group_size, g_idx), None, config,
                   gated=True, rms=rms)[0]


def int4_linear_add_residual(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                             qzeros: torch.Tensor, group_size: int, g_idx: torch.Tensor | None,
                             residual: torch.Tensor,
                             config: QuantGemvConfig | None = None) -> torch.Tensor:
    return _launch(x, int4_weight(qweight, scales, qzeros, group_size, g_idx), None, config,
                   residual=residual)[1]
