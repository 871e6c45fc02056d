"""What the MoE kernels share: the epilogue pieces, rounding as the reference (HF's experts path)
does, and the expert weights' formats with their scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.moe.reference import FP8_DTYPES
from hotpath.ops.quant.reference import BlockSize

# the expert weights' formats (the kernels' WFMT constexpr): in x's dtype, fp8 with a scale per
# output row, fp8 with a scale per GROUP_N x GROUP_K block
W16, FP8_CHANNEL, FP8_BLOCK = 0, 1, 2


@dataclass(frozen=True)
class ExpertFormat:
    """One stacked expert weight's format as the kernels read it."""

    wfmt: int
    scale: torch.Tensor | None  # fp32 [E, N] (channel) or [E, N blocks, K blocks] (block), contiguous
    group_n: int  # rows a block scale covers (1 otherwise)
    group_k: int  # columns a block scale covers (1 otherwise)

    def args(self, w: torch.Tensor) -> tuple:
        """The kernels' scale_ptr, stride_se, stride_sn (a stand-in pointer for 16-bit weights)."""
        if self.scale is None:
            return w, 0, 0
        return self.scale, self.scale.stride(0), self.scale.stride(1) if self.wfmt == FP8_BLOCK else 1

    def constexprs(self) -> dict:
        return dict(WFMT=self.wfmt, GROUP_N=self.group_n, GROUP_K=self.group_k)


W16_FORMAT = ExpertFormat(W16, None, 1, 1)


def expert_formats(w13: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None,
                   block_size: BlockSize | None) -> tuple[ExpertFormat, ExpertFormat]:
    """w13's and w2's formats (their shapes checked already by check_moe_args)."""
    if w13.dtype not in FP8_DTYPES:
        return W16_FORMAT, W16_FORMAT
    if block_size is None:
        return (ExpertFormat(FP8_CHANNEL, w13_scale.contiguous(), 1, 1),
                ExpertFormat(FP8_CHANNEL, w2_scale.contiguous(), 1, 1))
    bn, bk = block_size
    for value, what in ((bn, "block rows"), (bk, "block columns")):
        if value < 16 or value & (value - 1):
            raise ValueError(f"fp8 {what} must be a power of 2 of at least 16 for the Triton kernels, "
                             f"got {value}")
    return (ExpertFormat(FP8_BLOCK, w13_scale.contiguous(), bn, bk),
            ExpertFormat(FP8_BLOCK, w2_scale.contiguous(), bn, bk))


@triton.jit
def scale_rows(scale_ptr, expert, f, half, N, stride_se, stride_sn, WFMT: tl.constexpr,
               GROUP_N: tl.constexpr):
    """Pointers to the scales of weight rows f (+ N with half = 1: w13's up rows, whose block
    rows follow the gate's ceil(N / GROUP_N)) of `expert`: the row's own scale (channel), or the
    first of its block row's scales along K (block). A 16-bit weight's: the stand-in pointer."""
    base = scale_ptr + expert * stride_se
    if WFMT == 1:
        return base + (f + half * N).to(tl.int64)
    elif WFMT == 2:
        return base + (f // GROUP_N + half * tl.cdiv(N, GROUP_N)).to(tl.int64) * stride_sn
    return base + f * 0


@triton.jit
def block_segments(s_rows, k0, K, BLOCK_K: tl.constexpr, GROUP_K: tl.constexpr):
    """[..., BLOCK_K / SEG] fp32: the block scales of the SEG = min(BLOCK_K, GROUP_K)-column
    segments of the tile at k0, for the rows at s_rows ([..., 1] pointers)."""
    SEG: tl.constexpr = min(BLOCK_K, GROUP_K)
    seg = (k0 + tl.arange(0, BLOCK_K // SEG) * SEG) // GROUP_K
    return tl.load(s_rows + seg, mask=seg < tl.cdiv(K, GROUP_K), other=0.0)


@triton.jit
def silu_and_mul_rounded(gate, up, dtype: tl.constexpr):
    """silu(gate) * up from fp32 sums of the gate_up projection: the projection rounded to the
    model dtype, silu(gate) rounded again, the product rounded (torch's bf16 ops) -> dtype."""
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def weighted_term(y, weight, dtype: tl.constexpr):
    """One (token, expert) term of the sum over experts, from the fp32 sums of the down
    projection and the fp32 routing weight: both rounded to the model dtype, the product rounded
    to it (HF casts the router's weights to the model dtype) -> fp32."""
    return (y.to(dtype).to(tl.float32) * weight.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
