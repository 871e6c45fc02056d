"""What the MoE kernels share: the epilogue pieces, rounding as the reference (HF's experts path)
does, and the expert weights' formats with their scales (and int4's zero points and nibbles)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotpath.ops.moe.reference import FP8_DTYPES, INT4_DTYPE, int4_group
from hotpath.ops.quant.reference import BlockSize, int4_slice_width

# the expert weights' formats (the kernels' WFMT constexpr): in x's dtype, fp8 with a scale per
# output row, fp8 with a scale per GROUP_N x GROUP_K block, int4 words with a scale and a zero
# point per row and GROUP_K columns (ops/quant's int4 layout, SLICE its S)
W16, FP8_CHANNEL, FP8_BLOCK, INT4 = 0, 1, 2, 3
# the int4 kernels' dots take at least 16 columns of a nibble's run (a tile of 16 words)
INT4_MIN_SLICE = 16


@dataclass(frozen=True)
class ExpertFormat:
    """One stacked expert weight's format as the kernels read it."""

    wfmt: int
    # fp8: fp32 [E, N] (channel) or [E, N blocks, K blocks] (block); int4: [E, N, K / G] in the
    # model dtype; contiguous
    scale: torch.Tensor | None
    group_n: int  # rows a block scale covers (1 otherwise)
    group_k: int  # columns a block scale (int4: a group) covers (1 otherwise)
    zeros: torch.Tensor | None = None  # int4: uint8 [E, N, K / G], contiguous
    slice_width: int = 1  # int4: the layout's S (reference.int4_slice_width)

    def args(self, w: torch.Tensor) -> tuple:
        """The kernels' scale_ptr, zero_ptr, stride_se, stride_sn (stand-in pointers where a
        format has none; int4's zero points share their scales' strides)."""
        if self.scale is None:
            return w, w, 0, 0
        zeros = self.zeros if self.zeros is not None else w
        return (self.scale, zeros, self.scale.stride(0),
                self.scale.stride(1) if self.wfmt in (FP8_BLOCK, INT4) else 1)

    def constexprs(self) -> dict:
        return dict(WFMT=self.wfmt, GROUP_N=self.group_n, GROUP_K=self.group_k, SLICE=self.slice_width)

    def tile_k(self, block_k: int, dots: bool) -> int:
        """The K tile (columns) the kernels walk for a configured block_k: fp8 block weights
        held to one block where a dot multiplies the tile; int4 a whole number of words, at
        least INT4_MIN_SLICE (a dot's least) and at most a run (SLICE words)."""
        if self.wfmt == INT4:
            return 8 * min(max(block_k // 8, INT4_MIN_SLICE), self.slice_width)
        if self.wfmt == FP8_BLOCK and dots:
            return min(block_k, self.group_k)
        return block_k


W16_FORMAT = ExpertFormat(W16, None, 1, 1)


def expert_formats(w13: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None,
                   block_size: BlockSize | None, w13_zeros: torch.Tensor | None = None,
                   w2_zeros: torch.Tensor | None = None, group_size: int | None = None,
                   ) -> tuple[ExpertFormat, ExpertFormat]:
    """w13's and w2's formats (their shapes checked already by check_moe_args)."""
    if w13.dtype == INT4_DTYPE:
        H, I = 8 * w13.shape[2], w13.shape[1] // 2
        return (_int4_format(H, group_size, w13_scale, w13_zeros),
                _int4_format(I, group_size, w2_scale, w2_zeros))
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


def _int4_format(K: int, group_size: int, scale: torch.Tensor, zeros: torch.Tensor) -> ExpertFormat:
    G = int4_group(group_size, K)
    S = int4_slice_width(K, G)
    if S < INT4_MIN_SLICE or G & (G - 1):
        raise ValueError(f"the Triton MoE kernels read int4 experts whose projections' inputs are "
                         f"a multiple of {8 * INT4_MIN_SLICE} in groups of a power of 2 of at least "
                         f"{INT4_MIN_SLICE}; got {K} inputs in groups of {G}")
    return ExpertFormat(INT4, scale.contiguous(), 1, G, zeros.contiguous(), S)


@triton.jit
def scale_rows(scale_ptr, expert, f, half, N, stride_se, stride_sn, WFMT: tl.constexpr,
               GROUP_N: tl.constexpr):
    """Pointers to the scales of weight rows f (+ N with half = 1: w13's up rows, whose block
    rows follow the gate's ceil(N / GROUP_N)) of `expert`: the row's own scale (channel), or the
    first of its block row's scales along K (block), or of its groups' scales (int4; the same
    offsets from the zero points' pointer give the row's zero points). A 16-bit weight's: the
    stand-in pointer."""
    base = scale_ptr + expert * stride_se
    if WFMT == 1:
        return base + (f + half * N).to(tl.int64)
    elif WFMT == 2:
        return base + (f // GROUP_N + half * tl.cdiv(N, GROUP_N)).to(tl.int64) * stride_sn
    elif WFMT == 3:
        return base + (f + half * N).to(tl.int64) * stride_sn
    return base + f * 0


@triton.jit
def int4_run(u0, nib: tl.constexpr, SLICE: tl.constexpr):
    """The first column of nibble nib's run in the int4 tile at word u0: nibble nib of the
    tile's W consecutive words (W dividing SLICE, u0 a multiple of W) holds W consecutive
    columns, all in one group (ops/quant/reference.py's layout)."""
    return (u0 // SLICE) * (8 * SLICE) + nib * SLICE + u0 % SLICE


@triton.jit
def int4_operand(words, nib: tl.constexpr, zeros):
    """Nibble nib of int4 words minus their zero points (int32, broadcast against words): the
    exact integers q - z, each weight's value over its group's scale."""
    return ((words >> (4 * nib)) & 0xF) - zeros


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
