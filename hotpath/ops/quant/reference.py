"""Quantized linear algebra in plain torch: dequantize the stored weight and run the plain op.

Layouts (what the loaders convert every checkpoint format into):

- fp8: `weight` float8 [N, K] (e4m3fn; e4m3fnuz on AMD's MI300, see `fp8_dtype`), K contiguous;
  `scale` fp32 either per output channel, [N] (or [N, 1]), or per 128x128 block,
  [ceil(N / block_n), ceil(K / block_k)] with `block_size = (block_n, block_k)`:
  w[n, k] = weight[n, k] * scale[n // block_n, k // block_k].
- int4 (AWQ, GPTQ), the kernels' layout (hotpath/ops/quant/triton_int4.py says why):
  `scales` [N, K / G] in the model dtype, `qzeros` uint8 [N, K / G] (integer zero points 0..15),
  and `qweight` int32 [N, K / 8] holding the *stored* columns: the input columns in the order
  `perm` int32 [K] gives (stored column c is input column perm[c]; None: the same order), stored
  column c in group c // G. The stored columns are cut in superblocks of 8S (S =
  int4_slice_width(K, G), a power of 2 dividing K / 8 and G: 16 for G <= 128), and nibble j
  (bits 4j..4j+3) of word i of superblock b holds stored column 8Sb + jS + i, unsigned 0..15.
  w[n, perm[c]] = (q[n, c] - qzeros[n, c // G]) * scales[n, c // G].
  GPTQ's act-order `g_idx` [K] (input column k's group) becomes `perm = act_order_perm(g_idx)`,
  the input columns sorted by group, so every group is G consecutive stored columns.

Each function here is what the Triton kernel of the same name computes, rounding where it rounds:

- the few-rows GEMV path (decode) multiplies x, as it is, by the weight dequantized in fp32;
- the fp8 GEMM path (prefill) quantizes x to fp8 dynamically (per token for per-channel weights,
  per token and 128-column group for block weights), then multiplies the dequantized fp8 values
  in fp32;
- int4 in fp32 on both paths (the kernels' tensor-core operand is the exact integer q - z in
  x's dtype, each group's scale applied to its dots' fp32 sum).
"""

from __future__ import annotations

import torch

from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.linear.reference import RmsInput

# int4: rows up to this run the GEMV (each weight read once for every row, K split across the
# SMs, the decode chain's fused forms); more rows the GEMM (past 32 rows Triton's warpgroup MMA
# made the GEMV slow: docs/decisions.md)
GEMV_MAX_ROWS = 32
# fp8 weights take the weight-only GEMV up to this many rows only: from 3 rows x quantized to
# fp8 and the fp8 x fp8 GEMM are faster
FP8_GEMV_MAX_ROWS = 2
# The activation group of block-scaled fp8 (the weight's block_k in every published checkpoint)
ACT_GROUP = 128
# A scale never below this (an all-zero row would otherwise divide by zero): vLLM's floor
MIN_SCALE_FACTOR = 1.0 / 512.0

BlockSize = tuple[int, int]


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 dtype (448 for e4m3fn, 240 for e4m3fnuz)."""
    return float(torch.finfo(dtype).max)


# ---- dequantization -----------------------------------------------------------------------------
def per_channel_scale(scale: torch.Tensor, N: int) -> torch.Tensor:  # [N] fp32
    if scale.numel() != N:
        raise ValueError(f"a per-channel scale needs {N} entries, got shape {tuple(scale.shape)}")
    return scale.reshape(N).float()


def check_block_scale(scale: torch.Tensor, N: int, K: int, block_size: BlockSize) -> None:
    bn, bk = block_size
    expected = (-(-N // bn), -(-K // bk))
    if tuple(scale.shape) != expected:
        raise ValueError(f"block scales of a [{N}, {K}] weight in {bn}x{bk} blocks must be "
                         f"{list(expected)}, got {list(scale.shape)}")


def dequantize_fp8(
    weight: torch.Tensor,  # [N, K] float8
    scale: torch.Tensor,  # [N] / [N, 1] fp32 per channel, or [N / bn, K / bk] fp32 per block
    block_size: BlockSize | None,
) -> torch.Tensor:  # [N, K] fp32
    N, K = weight.shape
    w = weight.float()
    if block_size is None:
        return w * per_channel_scale(scale, N)[:, None]
    check_block_scale(scale, N, K, block_size)
    bn, bk = block_size
    s = scale.float().repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K]  # [N, K]
    return w * s


def fp8_e4m3fn_to_fnuz(
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale: torch.Tensor,  # any shape
) -> tuple[torch.Tensor, torch.Tensor]:  # [N, K] float8_e4m3fnuz, scale * 2
    """An e4m3fn weight as AMD gfx942's e4m3fnuz with the same dequantized values: the same bits
    mean half the value (exponent bias 8 rather than 7), so the scales double; -0 (0x80, NaN in
    e4m3fnuz) becomes 0."""
    bits = weight.view(torch.uint8)
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz), scale * 2


def int4_slice_width(K: int, group_size: int) -> int:
    """S of the int4 layout: the largest power of 2 dividing both K / 8 and the group size, and
    at most G / 8 (a superblock inside one group, so that the kernels scale once per superblock),
    16 (the kernels' smallest dot) and 128. The kernels need S >= 16: K a multiple of 128, G of 16."""
    if K % 8:
        raise ValueError(f"int4 weights need in_features a multiple of 8, got {K}")
    S = 128
    while S > 1 and ((K // 8) % S or group_size % S or S > max(16, group_size // 8)):
        S //= 2
    return S


def _layout_index(K: int, group_size: int, device) -> torch.Tensor:  # [K / 8, 8]
    """[w, j] -> the stored column that nibble j of word w holds."""
    S = int4_slice_width(K, group_size)
    w = torch.arange(K // 8, device=device)
    j = torch.arange(8, device=device)
    return ((w // S) * 8 * S + w % S)[:, None] + j[None, :] * S


def pack_int4_layout(q: torch.Tensor, group_size: int) -> torch.Tensor:  # [N, K / 8] int32
    """q [N, K] integers 0..15, in stored column order -> qweight in the int4 layout."""
    N, K = q.shape
    nibbles = q.to(torch.int64)[:, _layout_index(K, group_size, q.device)] & 0xF  # [N, K/8, 8]
    words = (nibbles << (4 * torch.arange(8, device=q.device))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4_layout(qweight: torch.Tensor, group_size: int) -> torch.Tensor:  # [N, K] int32, 0..15
    """qweight in the int4 layout -> its nibbles in stored column order."""
    N, K = qweight.shape[0], qweight.shape[1] * 8
    shifts = 4 * torch.arange(8, dtype=torch.int32, device=qweight.device)
    nibbles = (qweight[:, :, None] >> shifts) & 0xF  # [N, K/8, 8]
    q = torch.empty((N, K), dtype=torch.int32, device=qweight.device)
    q[:, _layout_index(K, group_size, qweight.device).reshape(-1)] = nibbles.reshape(N, K)
    return q


def act_order_perm(g_idx: torch.Tensor, group_size: int) -> torch.Tensor:  # [K] int32
    """GPTQ's g_idx (input column k's group) -> the input columns sorted by group (stably), which
    must give each group exactly group_size columns."""
    K = g_idx.shape[0]
    counts = torch.bincount(g_idx.long(), minlength=K // group_size)
    if K % group_size or counts.numel() != K // group_size or bool((counts != group_size).any()):
        raise ValueError(f"g_idx must give each of the {K // group_size} groups exactly "
                         f"{group_size} of the {K} columns")
    return torch.sort(g_idx.long(), stable=True).indices.to(torch.int32)


def check_int4_scales(scales: torch.Tensor, qzeros: torch.Tensor, N: int, K: int, group_size: int) -> None:
    expected = (N, K // group_size)
    if K % group_size or scales.shape != expected or qzeros.shape != expected or qzeros.dtype != torch.uint8:
        raise ValueError(f"scales {tuple(scales.shape)} and qzeros ({qzeros.dtype}) {tuple(qzeros.shape)} "
                         f"must both be {list(expected)}, qzeros uint8 ({K} columns in groups of {group_size})")


def dequantize_stored(
    qweight: torch.Tensor,  # [N, K / 8] int32
    scales: torch.Tensor,  # [N, K / G] model dtype
    qzeros: torch.Tensor,  # [N, K / G] uint8
    group_size: int,  # -1: all of K
) -> torch.Tensor:  # [N, K] fp32, in stored column order
    N, K = qweight.shape[0], qweight.shape[1] * 8
    G = K if group_size == -1 else group_size
    check_int4_scales(scales, qzeros, N, K, G)
    q = unpack_int4_layout(qweight, G)
    g = torch.arange(K, device=q.device) // G
    return (q - qzeros.long()[:, g]).float() * scales.float()[:, g]


def dequantize_int4(
    qweight: torch.Tensor,  # [N, K / 8] int32
    scales: torch.Tensor,  # [N, K / G] model dtype
    qzeros: torch.Tensor,  # [N, K / G] uint8
    group_size: int,
    g_idx: torch.Tensor | None = None,  # [K]: GPTQ act-order's, which ordered the stored columns
) -> torch.Tensor:  # [N, K] fp32, in input column order
    w = dequantize_stored(qweight, scales, qzeros, group_size)
    if g_idx is None:
        return w
    if g_idx.shape != (w.shape[1],):
        raise ValueError(f"g_idx must have shape ({w.shape[1]},), got {tuple(g_idx.shape)}")
    K = w.shape[1]
    out = torch.empty_like(w)
    out[:, act_order_perm(g_idx, K if group_size == -1 else group_size).long()] = w
    return out


# ---- dynamic activation quantization ------------------------------------------------------------
def _quantize(x: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype):
    fmax = fp8_max(out_dtype)
    # divided by a tensor: torch's CUDA division by a Python number multiplies by its reciprocal,
    # which can round differently from the kernels' (and the CPU's) IEEE division
    scale = torch.clamp(amax / torch.full_like(amax, fmax), min=MIN_SCALE_FACTOR / fmax)
    return scale, fmax


def quantize_fp8_per_token(
    x: torch.Tensor,  # [M, K]
    out_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M] fp32
    """Each row scaled so that its largest magnitude is the fp8 maximum: x ~ x_fp8 * scale."""
    xf = x.float()
    scale, fmax = _quantize(xf, xf.abs().amax(-1), out_dtype)
    x_fp8 = (xf / scale[:, None]).clamp(-fmax, fmax).to(out_dtype)
    return x_fp8, scale


def quantize_fp8_per_group(
    x: torch.Tensor,  # [M, K]
    group: int = ACT_GROUP,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, K] fp8, [M, ceil(K / group)] fp32
    """Each row's `group`-column groups scaled on their own (the last may be shorter)."""
    M, K = x.shape
    G = -(-K // group)
    xf = torch.nn.functional.pad(x.float(), (0, G * group - K)).view(M, G, group)
    scale, fmax = _quantize(xf, xf.abs().amax(-1), out_dtype)
    x_fp8 = (xf / scale[:, :, None]).clamp(-fmax, fmax).view(M, G * group)[:, :K].to(out_dtype)
    return x_fp8.contiguous(), scale


def dequantize_per_group(x_fp8: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """[M, K] fp8 and [M, ceil(K / group)] -> [M, K] fp32"""
    K = x_fp8.shape[1]
    return x_fp8.float() * scale.repeat_interleave(group, 1)[:, :K]


# ---- the linear ops -----------------------------------------------------------------------------
def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _finish(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None,
            out_dtype: torch.dtype | None) -> torch.Tensor:
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).to(out_dtype or x.dtype)


def fp8_linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,  # [N] or block scales
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,  # [N]
    rms: RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., N]
    """x @ dequantize_fp8(weight)^T (+ bias) as the kernels compute it: rows <= FP8_GEMV_MAX_ROWS in
    x's own precision, more rows with x quantized to fp8. `rms` (few rows only): x RMS-normalised
    first from the given statistic (see hotpath.ops.linear)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if rms is not None:
        x2 = linear_ref.rms_normalize(x2, *rms)
    w = dequantize_fp8(weight, weight_scale, block_size)
    if _rows(x) <= FP8_GEMV_MAX_ROWS:
        xq = x2.float()
    elif block_size is None:
        x_fp8, s = quantize_fp8_per_token(x2, weight.dtype)
        xq = x_fp8.float() * s[:, None]
    else:
        x_fp8, s = quantize_fp8_per_group(x2, block_size[1], weight.dtype)
        xq = dequantize_per_group(x_fp8, s, block_size[1])
    out = _finish(xq @ w.T, x, bias, out_dtype)
    return out.view(*x.shape[:-1], weight.shape[0])


def fp8_gemm(
    a: torch.Tensor,  # [M, K] fp8
    a_scale: torch.Tensor,  # [M] or [M, ceil(K / block_k)] fp32
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # [M, N]
    """(a * a_scale) @ dequantize_fp8(weight)^T (+ bias) in fp32, stored as out_dtype."""
    if block_size is None:
        xq = a.float() * a_scale.float().reshape(-1, 1)
    else:
        xq = dequantize_per_group(a, a_scale.float(), block_size[1])
    out = xq @ dequantize_fp8(weight, weight_scale, block_size).T
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def int4_linear(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,  # [N, K / 8] int32
    scales: torch.Tensor,  # [N, K / G]
    qzeros: torch.Tensor,  # [N, K / G] uint8
    group_size: int,
    perm: torch.Tensor | None = None,  # [K]
    bias: torch.Tensor | None = None,  # [N]
    rms: RmsInput | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [..., N]
    """x @ W^T (+ bias) in fp32, W dequantized in fp32: x's columns taken in the stored order
    (through perm) times dequantize_stored(...)^T (the kernels multiply the exact integers
    q - z in x's dtype and apply each group's scale to its sum; the same products, summed in
    another order). `rms` (few rows only): x RMS-normalised first (see hotpath.ops.linear)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if rms is not None:
        x2 = linear_ref.rms_normalize(x2, *rms)
    if perm is not None:
        if perm.shape != (K,):
            raise ValueError(f"perm must have shape ({K},), got {tuple(perm.shape)}")
        x2 = x2[:, perm.long()]
    w = dequantize_stored(qweight, scales, qzeros, group_size)
    out = _finish(x2.float() @ w.T, x, bias, out_dtype)
    return out.view(*x.shape[:-1], qweight.shape[0])


# ---- fused add + RMSNorm + per-token fp8 quantization --------------------------------------------
def fused_add_rms_norm_fp8(
    x: torch.Tensor,  # [M, H]
    residual: torch.Tensor,  # [M, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [M, H] fp8, [M] fp32, [M, H]
    """summed = x + residual; normed = RMSNorm(summed) rounded to x's dtype (as the plain fused
    norm rounds it); returns (normed quantized per token, its scales, summed)."""
    from hotpath.ops.norm.reference import rms_norm

    summed = x + residual
    x_fp8, scale = quantize_fp8_per_token(rms_norm(summed, weight, eps), out_dtype)
    return x_fp8, scale, summed
