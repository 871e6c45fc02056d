"""Linear for three rows or more (prefill, decode batches) over fp8 weights, on the tensor cores.

- `_fp8_gemm_kernel`: out = (a_fp8 * a_scale) @ (w_fp8 * w_scale)^T (+ bias), the activations
  quantized before (triton_quant: per token, or per token and 128-column group). A program owns a
  [BLOCK_M, BLOCK_N] output tile (tiles ordered in groups of GROUP_M rows of tiles, so that a
  wave of programs shares weight tiles in L2) and walks K in BLOCK_K steps of fp8 x fp8 dots.
  Per-channel weights (PTPC): one accumulator over all of K (on sm90 promoted to full fp32 every
  BLOCK_K, as the fp8 MMA accumulates in fewer bits), the token and channel scales multiplied in
  the epilogue. Block weights: BLOCK_K lies within one scale block, so each step's dot is scaled
  by its token-group scales and its weight block's scales as it is added (the main loop).

Tiles are a fixed rule of the shape (no autotuning: the kernels compile once per shape class and
are capturable), from a tile sweep (benchmarks/tune_quant_fp8.py; docs/decisions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.quant import triton_quant
from hotpath.ops.quant.reference import BlockSize
from hotpath.ops.quant.triton_gemv import fp8_weight
from hotpath.ops.triton_utils import sm_count


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # programs along K (fp8 GEMM; their fp32 partials summed by a second launch)


def choose_config(M: int, group_k: int, hip: bool, N: int = 0, K: int = 0,
                  sm_count: int = 132) -> GemmConfig:
    """`group_k`: the widest K tile the scales allow (a block's width). AMD's 64 KB of LDS holds
    two stages of 128 x 64 tiles.

    fp8 on NVIDIA: at decode batch sizes a tile of 16 rows (the weight is read once), 128 columns
    wide where that makes a wave of programs, else 64 with a deeper pipeline; prefills 128 x 128 x
    128 on 8 warps, 4 stages. A long K with too few tiles for a wave (the down projection at
    decode batch sizes) splits K in up to 4."""
    block_k = min(128 if not hip else 64, group_k)
    if hip:
        return GemmConfig(64, 128, block_k, 8, 4, 2) if M <= 64 else GemmConfig(128, 128, block_k, 8, 8, 2)
    if M <= 128:
        block_m = 16 if M <= 32 else 32 if M <= 64 else 64
        wide = triton.cdiv(M, block_m) * triton.cdiv(N, 128) >= sm_count
        block_n = 128 if wide else 64
        programs = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        split_k = min(triton.cdiv(2 * sm_count, programs), 4) if programs < sm_count and K >= 8192 else 1
        return GemmConfig(block_m, block_n, block_k, 8, 4, 4 if wide else 5, split_k)
    return GemmConfig(128, 128, block_k, 8, 8, 4)


def _is_hip(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is not None


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (tile row, tile column), tiles grouped GROUP_M rows at a time."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % rows, (pid % in_group) // rows


@triton.jit
def _store_tile(out_ptr, bias_ptr, acc, rm, rn, M, N, stride_om, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_gemm_kernel(
    a_ptr,  # [M, K] fp8, the quantized activations
    a_scale_ptr,  # [M] fp32 (per token) or [M, ceil(K / GROUP_K)] (per token and group)
    w_ptr,  # [N, K] fp8
    w_scale_ptr,  # [N] fp32 (per channel) or [ceil(N / GROUP_N), ceil(K / GROUP_K)] (block)
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]; with SPLIT_K > 1 fp32 partials [SPLIT_K, M, N], no bias
    M,
    N,
    K,
    k_per_split,  # a multiple of BLOCK_K (K with SPLIT_K = 1)
    stride_am,
    stride_wn,
    stride_asm,
    stride_wsn,
    stride_om,
    BLOCK_SCALED: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    IMPRECISE_ACC: tl.constexpr,  # the fp8 dot's max_num_imprecise_acc (None: the target's)
    SPLIT_K: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_start = tl.program_id(1) * k_per_split
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows past M / N read the last row again (never stored): the loads need no row mask
    rm_c = tl.minimum(rm, M - 1).to(tl.int64)
    rn_c = tl.minimum(rn, N - 1).to(tl.int64)
    a_rows = a_ptr + rm_c[:, None] * stride_am
    w_rows = w_ptr + rn_c[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(a_rows + rk[None, :])
            w = tl.load(w_rows + rk[None, :])
        else:
            a = tl.load(a_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0)
            w = tl.load(w_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0)
        if BLOCK_SCALED:
            kb = k0 // GROUP_K
            sa = tl.load(a_scale_ptr + rm_c * stride_asm + kb)
            sw = tl.load(w_scale_ptr + (rn_c // GROUP_N) * stride_wsn + kb)
            acc += tl.dot(a, tl.trans(w)) * (sa[:, None] * sw[None, :])
        else:
            acc = tl.dot(a, tl.trans(w), acc, max_num_imprecise_acc=IMPRECISE_ACC)
    if not BLOCK_SCALED:
        acc *= tl.load(a_scale_ptr + rm_c)[:, None] * tl.load(w_scale_ptr + rn_c)[None, :]
    if SPLIT_K > 1:
        _store_tile(out_ptr + tl.program_id(1).to(tl.int64) * M * N, bias_ptr, acc, rm, rn, M, N, N,
                    False)
    else:
        _store_tile(out_ptr, bias_ptr, acc, rm, rn, M, N, stride_om, HAS_BIAS)


@triton.jit
def _sum_splits_kernel(part_ptr, bias_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """out = the SPLIT_K partials [SPLIT_K, M, N] summed in split order (+ bias), a program per
    BLOCK outputs of a row: the same sum whatever order the splits ran in."""
    row = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + row).to(tl.int64) * N + rn, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _grid(M: int, N: int, cfg: GemmConfig) -> tuple[int]:
    return (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)


def fp8_gemm(
    a: torch.Tensor,  # [M, K] fp8, quantized activations
    a_scale: torch.Tensor,  # [M] fp32, or [M, ceil(K / block_k)] with block_size
    weight: torch.Tensor,  # [N, K] fp8 (the same fp8 dtype as a)
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype = torch.bfloat16,
    config: GemmConfig | None = None,
) -> torch.Tensor:  # [M, N]
    """(a * a_scale) @ (weight * weight_scale)^T (+ bias) in fp32, stored as out_dtype."""
    w = fp8_weight(weight, weight_scale, block_size)
    M, K = a.shape
    N = w.rows
    if a.dtype != weight.dtype or K != w.K or a.stride(1) != 1:
        raise ValueError(f"activations {a.dtype} {tuple(a.shape)} (row-major) do not match the "
                         f"weight {weight.dtype} {tuple(weight.shape)}")
    group_k = block_size[1] if block_size is not None else 128
    expected = (M, triton.cdiv(K, group_k)) if block_size is not None else (M,)
    if tuple(a_scale.shape) != expected:
        raise ValueError(f"activation scales must be {list(expected)}, got {list(a_scale.shape)}")
    a_scale = a_scale.float().contiguous()
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    out = torch.empty((M, N), dtype=out_dtype, device=a.device)  # [M, N]
    if M == 0 or N == 0:
        return out
    hip = _is_hip(a.device)
    cfg = config or choose_config(M, group_k, hip, N=N, K=K, sm_count=sm_count(a.device))
    if block_size is not None and group_k % cfg.block_k:
        raise ValueError(f"a K tile of {cfg.block_k} spans two scale blocks of {group_k}")
    on_cuda = a.device.type == "cuda" and not hip
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.block_k), cfg.split_k) * cfg.block_k
    # fp32 partials [split_k, M, N] where K is split
    target = out if cfg.split_k == 1 else torch.empty((cfg.split_k, M, N), dtype=torch.float32,
                                                      device=a.device)
    _fp8_gemm_kernel[(_grid(M, N, cfg)[0], cfg.split_k)](
        a, a_scale, w.data, w.scale, bias if bias is not None else out, target,
        M, N, K, k_per_split, a.stride(0), w.data.stride(0), a_scale.stride(0),
        w.scale.stride(0) if w.scale.dim() == 2 else 1, out.stride(0),
        BLOCK_SCALED=block_size is not None,
        GROUP_N=w.group_n,
        GROUP_K=group_k,
        HAS_BIAS=bias is not None,
        EVEN_K=K % cfg.block_k == 0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        IMPRECISE_ACC=cfg.block_k if on_cuda else None,
        SPLIT_K=cfg.split_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1:
        _sum_splits_kernel[(M, triton.cdiv(N, 1024))](
            target, bias if bias is not None else out, out, M, N, out.stride(0),
            SPLIT_K=cfg.split_k, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4)
    return out


def fp8_linear(
    x: torch.Tensor,  # [..., K]
    weight: torch.Tensor,  # [N, K] fp8
    weight_scale: torch.Tensor,
    block_size: BlockSize | None,
    bias: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:  # [..., N]
    """x quantized dynamically (per token for per-channel weights, per token and block_k group
    for block weights) in the weight's fp8 dtype, then fp8_gemm."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if block_size is None:
        a, a_scale = triton_quant.quantize_fp8_per_token(x2, weight.dtype)
    else:
        a, a_scale = triton_quant.quantize_fp8_per_group(x2, block_size[1], weight.dtype)
    out = fp8_gemm(a, a_scale, weight, weight_scale, block_size, bias, x.dtype, config)
    return out.view(*x.shape[:-1], weight.shape[0])


__all__ = ["GemmConfig", "fp8_gemm", "fp8_linear"]
