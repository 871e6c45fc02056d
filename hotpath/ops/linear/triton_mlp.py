"""The gated MLP of a decode step of one or two rows in one kernel, on small models:
acc += down(silu(gate(rmsnorm(x))) * up(rmsnorm(x))), acc an fp32 sum the next kernel rounds.

At batch 1 a small model's step is a chain of short kernels, and every kernel boundary costs
about a microsecond of waiting and ramping up (docs/benchmarks.md, run F: a kernel that only waits
and copies added ~1 us a layer). The MLP's two projections need not be two kernels: the
intermediate feature f's output, silu(gate_f . x) * (up_f . x), is all that down_proj needs of
row f of its transposed weight, so a program owning BLOCK_F intermediate features can form them
and multiply them into its [BLOCK_F, hidden] slice of down_proj's weight at once. The programs'
partial outputs are summed with fp32 atomic adds into `acc`, which the next kernel adds (rounded
as the reference rounds down_proj's output) into the residual stream (ops/linear's
`linear_add_norm`); the layer's o_proj zeroes `acc` first (`linear_add_residual(zero=acc)`).

Each program's three weight tiles (gate rows, up rows, down_proj's weight rows, transposed so
that they are contiguous: `hotpath.layers.activation.GatedMLP.transpose_down`) are all loading
before PDL's wait; after it, x (normalised with the statistic the o_proj epilogue left), the sums,
SiLU-and-mul and the down products are on-chip work, and one atomic add per output element.
The sums' order across programs is not fixed, so a step's down_proj output can differ from run
to run in its last bit before rounding (the GPU parity tests allow for that: near ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.linear.reference import RmsInput
from hotpath.ops.linear.triton_gemv import WEIGHT_EVICTION, _normed_x, _rstd, _w_tile
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch_dependents, pdl_wait

# rows -> (intermediate features a program owns, warps). Registers a thread at Qwen3-0.6B's shape
# (Triton 3.6, sm_90): one row, 8 features over 4 warps 128 (4 programs an SM: the 384 programs
# in one wave); two rows, 4 features over 4 warps 124 (8 over 8 warps took 139)
CONFIGS = {1: (8, 4), 2: (4, 4)}
WRITE = 0  # EXPERIMENT


@triton.jit
def _gated_mlp_kernel(
    x_ptr,  # [M, H] the MLP's input before its RMSNorm
    norm_w_ptr,  # [H]
    stat_ptr,  # [n_stat, M] fp32 partial sums of squares of x's rows
    n_stat,
    eps,
    gate_up_ptr,  # [2I, H] = [gate | up], H contiguous
    down_t_ptr,  # [I, H] down_proj's weight transposed, H contiguous
    acc_ptr,  # [M, H] fp32, += the MLP's output
    I,
    H,
    stride_xm,
    stride_gu,
    stride_d,
    stride_am,
    M: tl.constexpr,  # rows: 1 or 2
    BLOCK_F: tl.constexpr,
    BLOCK_H: tl.constexpr,  # >= H: a program holds whole rows
    EVEN_H: tl.constexpr,
    USE_PDL: tl.constexpr,
    W_EVICT: tl.constexpr,
    WRITE: tl.constexpr,  # EXPERIMENT: 0 atomics, 1 plain stores, 2 atomics spread 8 floats a 128-B line
):
    pdl_launch_dependents(USE_PDL)
    rf = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = rf < I
    # features past I read feature I - 1 (full-width loads, no row mask); their products are
    # zeroed before the down sums
    f = tl.minimum(rf, I - 1).to(tl.int64)[:, None]
    rh = tl.arange(0, BLOCK_H)
    wg = _w_tile(gate_up_ptr + f * stride_gu, rh, H, EVEN_H, W_EVICT)  # [BLOCK_F, BLOCK_H]
    wu = _w_tile(gate_up_ptr + (f + I) * stride_gu, rh, H, EVEN_H, W_EVICT)
    wd = _w_tile(down_t_ptr + f * stride_d, rh, H, EVEN_H, W_EVICT)
    pdl_wait(USE_PDL)
    dtype = x_ptr.dtype.element_ty
    rm = tl.arange(0, M)
    rstd = _rstd(stat_ptr, n_stat, rm, M, H, eps, 1024)  # [M]
    for m in tl.static_range(M):
        if EVEN_H:
            x = tl.load(x_ptr + m * stride_xm + rh)
        else:
            x = tl.load(x_ptr + m * stride_xm + rh, mask=rh < H, other=0.0)
        x = _normed_x(x, rh, norm_w_ptr, tl.sum(tl.where(rm == m, rstd, 0.0)), H, EVEN_H)
        xf = x.to(tl.float32)[None, :]
        # rounded as the reference rounds: the projections, silu(gate), the product
        gate = tl.sum(wg.to(tl.float32) * xf, axis=1).to(dtype).to(tl.float32)  # [BLOCK_F]
        up = tl.sum(wu.to(tl.float32) * xf, axis=1).to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        y = tl.where(f_ok, (silu * up).to(dtype).to(tl.float32), 0.0)
        out = tl.sum(wd.to(tl.float32) * y[:, None], axis=0)  # [BLOCK_H] fp32
        if WRITE == 0:
            tl.atomic_add(acc_ptr + m * stride_am + rh, out, mask=rh < H, sem="relaxed")
        elif WRITE == 1:
            tl.store(acc_ptr + m * stride_am + rh, out, mask=rh < H)
        else:
            tl.atomic_add(acc_ptr + m * stride_am * 4 + (rh // 8) * 32 + rh % 8, out, mask=rh < H,
                          sem="relaxed")


def gated_mlp_accumulate(
    x: torch.Tensor,  # [M, H], M <= 2
    gate_up: torch.Tensor,  # [2I, H] = [gate | up], H contiguous
    down_t: torch.Tensor,  # [I, H] down_proj's weight transposed, H contiguous
    acc: torch.Tensor,  # [M, H] fp32, += the MLP's output
    rms: RmsInput,
    config: tuple[int, int] | None = None,  # (block_f, num_warps): CONFIGS's by default
) -> None:
    """acc += down(silu(gate(x')) * up(x')), x' = RMSNorm(x) from the statistic's partial sums."""
    M, H = x.shape
    I = down_t.shape[0]
    stat, norm_w, eps = rms
    assert gate_up.shape == (2 * I, H) and down_t.shape == (I, H) and acc.shape == (M, H)
    assert acc.dtype == torch.float32 and 0 < M <= 2 and stat.shape[1] == M
    assert x.stride(-1) == gate_up.stride(-1) == down_t.stride(-1) == acc.stride(-1) == 1
    block_f, num_warps = config or CONFIGS[M]
    if WRITE == 2:
        from hotpath.ops.triton_utils import zeroed_counters
        acc = zeroed_counters("mlp spread experiment", M * 4 * H, x.device, torch.float32).view(M, 4 * H)
    block_h = triton.next_power_of_2(H)
    use_pdl = pdl_enabled(x.device)
    stat = stat.contiguous()
    _gated_mlp_kernel[(triton.cdiv(I, block_f),)](
        x, norm_w, stat, stat.shape[0], eps, gate_up, down_t, acc, I, H,
        x.stride(0), gate_up.stride(0), down_t.stride(0), acc.stride(0),
        M=M, BLOCK_F=block_f, BLOCK_H=block_h, EVEN_H=H == block_h, USE_PDL=use_pdl,
        W_EVICT=WEIGHT_EVICTION, WRITE=WRITE, num_warps=num_warps, num_stages=1, launch_pdl=use_pdl,
    )
