"""Linear over int4 weights (AWQ, GPTQ) on the tensor cores, for every row count: a GEMV for a
few rows (decode, 1..32, with the fused forms of hotpath.ops.linear) and a GEMM for more.

Why tensor cores even at one row: at HBM speed an FMA path that spends four operations a nibble
(shift, mask, convert, FMA) is bound by its ALUs well below the bandwidth (docs/decisions.md,
quantization). Here a nibble costs ~1.4 operations and the multiply-adds go to the tensor cores
(x's rows padded to 16, the least a dot takes, or to 32).

The layout (reference.py has it in full): `qweight` int32 [N, K / 8] whose stored columns are cut
in superblocks of 8S columns (S = reference.int4_slice_width(K, G): 16 for groups up to 128, so
that a superblock lies inside one group; a power of 2 dividing both K / 8 and G), nibble j of word
i of a superblock holding its column jS + i. So nibble j of a tile of W consecutive words (W
dividing S) is a contiguous run of W columns of x, inside one quantization group. What a program does with a [BLOCK_N, W] word tile:

- dequantizes it into 8 operands [BLOCK_N, W], nibble j minus its group's zero point, exact in
  x's 16-bit dtype. On NVIDIA, inline PTX does two nibbles per 32-bit operation: the mask
  0x000F000F picks nibble j of two consecutive words (gathered into one register's two halves
  by a prmt, so that the result is the MMA's operand register as it is) into the low mantissa
  bits of the halves, OR-ed with the exponent of 128 (bf16 0x4300: 128 + q exactly) or of 1024
  (fp16 0x6400), and one packed FMA subtracts (magic + zero point): q - z, exact (~1.5 operations
  a nibble). Elsewhere (AMD, fp32 x, the interpreter) plain shifts, masks and a conversion;
- multiplies each operand by its slice of x (acc[BLOCK_N, BLOCK_M] += operand @ x_slice^T), the
  dots of one group chained, and multiplies the group's scale into their sum ([BLOCK_N] scales,
  not one per weight element): the scale costs 16 / G operations a nibble. A slice per group
  (S = G, as with groups of 32 where K / 8 allows it) would take an accumulator per slice:
  ptxas spilled the GEMM's 128 x 128 tiles so, which is why S stays at G / 8 where it can;
- GPTQ's act-order (g_idx) is a column permutation applied at load: the stored columns are the
  input columns sorted by group, `perm` [K] says which input column each holds, and the GEMV
  gathers x's columns through it (the GEMM permutes x once, beforehand).

The GEMV (`_int4_gemv_kernel`): a program owns BLOCK_N output features (virtual rows: weight rows,
or gate/up pairs with GATED) and one split of K, walks it in W-word tiles (pipelined through
shared memory, num_stages), and ends with hotpath.ops.linear.triton_gemv's epilogue (`_store_out`:
bias, silu(gate) * up, add into the residual with each tile's sums of squares). Its dots are
transposed, x's padded rows as M (acc [BLOCK_M, BLOCK_N] += x_j @ q_j^T): Triton then uses
mma.sync, both operands in registers, where a 64-row weight operand got Hopper's warpgroup MMA,
waited out after each 64 x 16 x 16 product (8 waits and fences a tile). The next tile's scales
and zero points load a tile ahead (they are too small for the pipeliner's asynchronous copies,
and loaded where they are used they cost every tile a memory round trip). An `rms=` input is
normalised by the RMSNorm kernel first, a launch of its own: folded into x's slices (the norm
weight loaded in the loop) the GEMV ran at a third of its plain speed. The first
weight tile and its scales load before PDL's wait. A K split writes fp32 partials and the last
program of an N tile to arrive (a counter bumped atomically) reduces them and runs the
epilogue: one launch, capturable, no host sync.
The GEMM (`_int4_gemm_kernel`): [BLOCK_N, BLOCK_M] output tiles (the weight as the dot's first
operand, where Hopper's MMA takes it from registers), tiles grouped GROUP_M at a time for L2.

Rounding: the products are those of the exact integers q - z with x as it is (16-bit, or fp32
with "ieee" dots), accumulated in fp32 per group and scaled in fp32; the reference dequantizes in
fp32 and multiplies in fp32, so the two differ by summation order only. Tiles come from
`choose_gemv_config` / `choose_gemm_config`, fixed rules of the shape set from a tile sweep
(benchmarks/bench_quant_gemv.py --sweep; benchmarks/int4_codegen.py shows what each config
compiles to).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

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
from hotpath.ops.quant import reference
from hotpath.ops.quant.reference import GEMV_MAX_ROWS
from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    zeroed_counters,
)

# the kernels' dots take at least 16 columns of a slice
MIN_SLICE = 16
# programs per SM the GEMV's K split aims at (what a 4-warp program's registers allow)
GEMV_PROGRAMS_PER_SM = 4


@dataclass(frozen=True)
class Int4GemvConfig:
    block_n: int  # virtual rows per program
    block_w: int  # words (8 columns each) per tile along K, dividing the slice width
    split_k: int  # programs along K (1: no split)
    num_warps: int
    num_stages: int
    asm: bool | None = None  # the PTX dequantization (None: on NVIDIA GPUs; see _use_asm)


@dataclass(frozen=True)
class Int4GemmConfig:
    block_m: int  # x rows per program
    block_n: int  # weight rows per program
    block_w: int
    group_m: int
    num_warps: int
    num_stages: int
    asm: bool | None = None


def gemv_block_m(M: int) -> int:
    """x's rows padded for the GEMV's dots: 16 (the least a dot takes) or 32."""
    return max(DOT_BLOCK_M, triton.next_power_of_2(M))


def choose_gemv_config(M: int, rows: int, K: int, slice_width: int,
                       device: torch.device) -> Int4GemvConfig:
    """Tiles for M <= GEMV_MAX_ROWS rows of a [rows, K] weight: 128 rows x 16 words, 4 warps (8
    warps leave x's 16 x 16 slices too small for asynchronous copies), 3 stages in flight, K split
    until there are GEMV_PROGRAMS_PER_SM programs an SM. Up to 16 rows the tile is the same: the
    dot pads x to 16 rows anyway (docs/decisions.md, quantization)."""
    block_w, block_n = MIN_SLICE, 128
    split = split_for(triton.cdiv(rows, block_n), K // 8, block_w, device, GEMV_PROGRAMS_PER_SM)
    return Int4GemvConfig(block_n, block_w, split, 4, 3)


def choose_gemm_config(M: int, slice_width: int, device: torch.device) -> Int4GemmConfig:
    """Tiles for more rows: 64 x rows by 128 weight rows, 16-word tiles, 4 warps, the fastest
    of the candidates swept at prefill sizes (docs/decisions.md, quantization)."""
    hip = device.type == "cuda" and torch.version.hip is not None
    return Int4GemmConfig(64, 128, MIN_SLICE, 8, 4, 2 if hip else 3)


# ---- dequantization ------------------------------------------------------------------------------
# Two words at once ($8, $9: elements e and e + 1 of the tile, which in the dots' operand layouts
# are a row's two consecutive words along K, the pair one MMA register holds). prmt gathers the
# two words' low halves (nibbles 0..3) and high halves (4..7) into v and u; nibble j of both words
# then lies at bits 4j' (j' = j mod 4) of the two 16-bit halves, and is shifted down, masked into
# the mantissa with the magic exponent OR-ed in (lop3: (a & b) | c), and one packed FMA (x * 1 +
# -(magic + zero)) leaves the exact q - z of both words in one register: the MMA's operand as it
# is, nothing to repack. $10..$17: -(magic + zero) of slice j, element e's in the low half.
def _dequant_ptx(fp16: bool, width: int = 0) -> str:
    one, magic, fma = (("0x3C003C00", "0x64006400", "fma.rn.f16x2") if fp16 else
                       ("0x3F803F80", "0x43004300", "fma.rn.bf16x2"))
    lines = [".reg .b32 v, u, t<6>, p<8>, one, h, g;", f"mov.b32 one, {one};",
             "prmt.b32 v, $8, $9, 0x5410;", "prmt.b32 u, $8, $9, 0x7632;"]
    if width:
        # the two words' high bits ($18, $19: W bits a nibble, nibble j at bit W j) in one register
        lines.append("prmt.b32 h, $18, $19, 0x5410;")
    for j in range(8):
        src = "vu"[j // 4]
        if j % 4:
            lines.append(f"shr.u32 t{j - 1 - j // 4}, {src}, {4 * (j % 4)};")
            src = f"t{j - 1 - j // 4}"
        lines.append(f"lop3.b32 p{j}, {src}, 0x000F000F, {magic}, 0xEA;")
        if width:
            # nibble j's high bits to bits 4 .. 4 + W of both halves, OR-ed into the mantissa
            shift = width * j - 4
            lines.append(f"shr.u32 g, h, {shift};" if shift > 0 else
                         f"shl.b32 g, h, {-shift};" if shift < 0 else "mov.b32 g, h;")
            mask = ((1 << width) - 1) << 4
            lines.append(f"lop3.b32 p{j}, g, 0x{mask | mask << 16:08X}, p{j}, 0xEA;")
    lines += [f"{fma} ${j}, p{j}, one, ${10 + j};" for j in range(8)]
    return "{\n" + "\n".join(lines) + "\n}"


# Two words at once ($8, $9: elements e and e + 1 of the tile, which in the dots' operand layouts
# are a row's two consecutive words along K, the pair one MMA register holds). prmt gathers the
# two words' low halves (nibbles 0..3) and high halves (4..7) into v and u; nibble j of both words
# then lies at bits 4 (j mod 4) of the two 16-bit halves, and is shifted down, masked into the
# mantissa with the magic exponent OR-ed in (lop3: (a & b) | c), and one packed FMA (x * 1 +
# -(magic + zero)) leaves the exact q - z of both words in one register: the MMA's operand as it
# is, nothing to repack. $10..$17: -(magic + zero) of slice j (element e's in the low half).
# With high bits (GGUF's 5- and 6-bit codes, hotpath.ops.gguf): $18, $19 the two words' W-bit
# fields, nibble j's at bit W j, OR-ed above the nibble (codes up to 63: exact at either magic).
_PTX_BF16: tl.constexpr = tl.constexpr(_dequant_ptx(False))
_PTX_F16: tl.constexpr = tl.constexpr(_dequant_ptx(True))
_PTX_BF16_H1: tl.constexpr = tl.constexpr(_dequant_ptx(False, 1))
_PTX_F16_H1: tl.constexpr = tl.constexpr(_dequant_ptx(True, 1))
_PTX_BF16_H2: tl.constexpr = tl.constexpr(_dequant_ptx(False, 2))
_PTX_F16_H2: tl.constexpr = tl.constexpr(_dequant_ptx(True, 2))


@triton.jit
def _slice_col(u0, j: tl.constexpr, SLICE: tl.constexpr):
    """The stored column of nibble j of word u0 (the first word of a tile)."""
    return (u0 // SLICE) * (8 * SLICE) + j * SLICE + u0 % SLICE


@triton.jit
def _tile_scales(scale_ptr, zero_ptr, s_rows, u0, SLICE: tl.constexpr, GROUP: tl.constexpr):
    """The scales (fp32) and zero points (int32) of the tile at word u0, for rows at offsets
    s_rows [R] of the scale and zero arrays: tuples of 8 [R], slice j's group's (slices of one
    group share one load)."""
    JPG: tl.constexpr = min(8, GROUP // SLICE)  # consecutive slices in one group
    ss = ()
    zs = ()
    for j in tl.static_range(8):
        if j % JPG == 0:
            g = _slice_col(u0, j, SLICE) // GROUP
            s = tl.load(scale_ptr + s_rows + g).to(tl.float32)
            z = tl.load(zero_ptr + s_rows + g).to(tl.int32)
        ss = ss + (s,)
        zs = zs + (z,)
    return ss, zs


@triton.jit
def _dequant(words, zs, DTYPE: tl.constexpr, USE_ASM: tl.constexpr, hi=None, WIDTH: tl.constexpr = 0):
    """int32 words [A, B] -> 8 operands [A, B] in DTYPE: nibble j minus zs[j] (int32, [A, 1] or
    [1, B]: a weight row's zero point), exact. With WIDTH (1, 2), hi (int32 [A, B]) holds W more
    bits a nibble, nibble j's at bit W j, above its 4 (GGUF's 5- and 6-bit codes)."""
    q = ()
    if USE_ASM:
        if DTYPE == tl.float16:
            magic: tl.constexpr = 0x6400
        else:
            magic: tl.constexpr = 0x4300
        nz = ()
        for j in tl.static_range(8):
            # -(magic + z) in the 16-bit dtype's bits (the sign flipped), truncated to 16 bits
            nz = nz + (((zs[j] | magic) ^ 0x8000).to(tl.int16),)
        # pack=2: the asm takes elements e, e + 1 together, the 16-bit operands two to a register
        if WIDTH == 0:
            out = tl.inline_asm_elementwise(
                _PTX_F16 if DTYPE == tl.float16 else _PTX_BF16,
                "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r",
                [words, nz[0], nz[1], nz[2], nz[3], nz[4], nz[5], nz[6], nz[7]],
                dtype=(tl.int16,) * 8, is_pure=True, pack=2)
        else:
            if WIDTH == 1:
                ptx: tl.constexpr = _PTX_F16_H1 if DTYPE == tl.float16 else _PTX_BF16_H1
            else:
                ptx: tl.constexpr = _PTX_F16_H2 if DTYPE == tl.float16 else _PTX_BF16_H2
            out = tl.inline_asm_elementwise(
                ptx, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r",
                [words, nz[0], nz[1], nz[2], nz[3], nz[4], nz[5], nz[6], nz[7], hi],
                dtype=(tl.int16,) * 8, is_pure=True, pack=2)
        for j in tl.static_range(8):
            q = q + (out[j].to(DTYPE, bitcast=True),)
    else:
        for j in tl.static_range(8):
            code = (words >> (4 * j)) & 0xF
            if WIDTH:
                code = code | (((hi >> (WIDTH * j)) & ((1 << WIDTH) - 1)) << 4)
            q = q + ((code - zs[j]).to(DTYPE),)
    return q


@triton.jit
def _col(vs):
    """A tuple of [R] as [R, 1]."""
    out = ()
    for j in tl.static_range(len(vs)):
        out = out + (vs[j][:, None],)
    return out


@triton.jit
def _row(vs):
    """A tuple of [R] as [1, R]."""
    out = ()
    for j in tl.static_range(len(vs)):
        out = out + (vs[j][None, :],)
    return out


@triton.jit
def _tile_dots(q, ss, xs, acc, SLICE: tl.constexpr, GROUP: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """The GEMM's: acc [R, C] += sum over slices j of ss[j] * (q[j] [R, W] @ xs[j] [W, C]), the
    dots of one group chained before its scale ([R])."""
    JPG: tl.constexpr = min(8, GROUP // SLICE)
    for b in tl.static_range(8 // JPG):
        part = tl.dot(q[b * JPG], xs[b * JPG], input_precision=DOT_PRECISION)
        for i in tl.static_range(1, JPG):
            part = tl.dot(q[b * JPG + i], xs[b * JPG + i], part, input_precision=DOT_PRECISION)
        acc += part * ss[b * JPG][:, None]
    return acc


@triton.jit
def _tile_dots_t(q, ss, xs, acc, SLICE: tl.constexpr, GROUP: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """The GEMV's, transposed: acc [C, R] += sum over slices j of ss[j] * (xs[j] [C, W] @ q[j]
    [W, R]) (x's padded rows as the dot's M: mma.sync, whose operands are registers, rather
    than a warpgroup MMA that would wait out each 64 x 16 x 16 product)."""
    JPG: tl.constexpr = min(8, GROUP // SLICE)
    for b in tl.static_range(8 // JPG):
        part = tl.dot(xs[b * JPG], q[b * JPG], input_precision=DOT_PRECISION)
        for i in tl.static_range(1, JPG):
            part = tl.dot(xs[b * JPG + i], q[b * JPG + i], part, input_precision=DOT_PRECISION)
        acc += part * ss[b * JPG][None, :]
    return acc


@triton.jit
def _x_slices(x_ptr, stride_xm, M, perm_ptr, u0, rm, SLICE: tl.constexpr, HAS_PERM: tl.constexpr,
              BLOCK_W: tl.constexpr, TRANS: tl.constexpr = True):
    """x's columns under the tile at word u0, a slice per nibble: 8 x [BLOCK_W, BLOCK_M] (TRANS;
    else [BLOCK_M, BLOCK_W]), rows past M zero; gathered through perm (HAS_PERM)."""
    xs = ()
    for j in tl.static_range(8):
        rk = _slice_col(u0, j, SLICE) + tl.arange(0, BLOCK_W)
        if HAS_PERM:
            rk = tl.load(perm_ptr + rk)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None], other=0.0)
        xs = xs + (tl.trans(x) if TRANS else x,)
    return xs


# ---- the GEMV (few rows) --------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M", "N"])
def _int4_gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # int32 [rows, K / 8]; rows = N (2N = [gate | up] with GATED)
    scale_ptr,  # [rows, K / G]
    zero_ptr,  # uint8 [rows, K / G]
    perm_ptr,  # int32 [K] (HAS_PERM)
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]; with RESIDUAL the residual stream, updated in place
    partial_ptr,  # [split, M, rows] fp32 (SPLIT)
    counter_ptr,  # [>= n tiles] int32, zero between calls (SPLIT)
    stat_ptr,  # [n_tiles, M] fp32 (RESIDUAL)
    M,
    N,  # output features
    K,
    w_per_split,  # words of K a split takes, a multiple of BLOCK_W
    stride_xm,
    stride_wn,
    stride_sn,  # the scales' (and zeros') row stride
    stride_om,
    SLICE: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_PERM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    W_EVICT: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rv, w_row, rows_total = _virtual_rows(pid_n, N, BLOCK_N, GATED)
    # the tile transposed, [BLOCK_W, BLOCK_N]: x's rows are the dots' M (see _tile_dots_t)
    w_cols = w_ptr + w_row.to(tl.int64)[None, :] * stride_wn
    s_rows = w_row.to(tl.int64) * stride_sn
    rm = tl.arange(0, BLOCK_M)
    rw = tl.arange(0, BLOCK_W)[:, None]
    dtype = x_ptr.dtype.element_ty
    u_start = pid_k * w_per_split
    u_end = tl.minimum(u_start + w_per_split, K // 8)
    # the weights and their scales are not written by any kernel: the first tile and its scales
    # load before the wait
    words = tl.load(w_cols + (u_start + rw), eviction_policy=W_EVICT)
    ss, zs = _tile_scales(scale_ptr, zero_ptr, s_rows, u_start, SLICE, GROUP)
    pdl_wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # each tile's successor's scales and zero points load a tile ahead (the last tile loads its
    # own again): a load the loop waits for at once would cost every tile a memory round trip
    ss_next, zs_next = _tile_scales(scale_ptr, zero_ptr, s_rows,
                                    tl.minimum(u_start + BLOCK_W, u_end - BLOCK_W), SLICE, GROUP)
    xs = _x_slices(x_ptr, stride_xm, M, perm_ptr, u_start, rm, SLICE, HAS_PERM, BLOCK_W, False)
    acc = _tile_dots_t(_dequant(words, _row(zs), dtype, USE_ASM), ss, xs, acc, SLICE, GROUP,
                       DOT_PRECISION)
    ss, zs = ss_next, zs_next
    for u0 in range(u_start + BLOCK_W, u_end, BLOCK_W):
        ss_next, zs_next = _tile_scales(scale_ptr, zero_ptr, s_rows,
                                        tl.minimum(u0 + BLOCK_W, u_end - BLOCK_W), SLICE, GROUP)
        words = tl.load(w_cols + (u0 + rw), eviction_policy=W_EVICT)
        xs = _x_slices(x_ptr, stride_xm, M, perm_ptr, u0, rm, SLICE, HAS_PERM, BLOCK_W, False)
        acc = _tile_dots_t(_dequant(words, _row(zs), dtype, USE_ASM), ss, xs, acc, SLICE, GROUP,
                           DOT_PRECISION)
        ss, zs = ss_next, zs_next
    acc = tl.trans(acc)  # [BLOCK_N, BLOCK_M]
    _store_or_reduce(acc, rv, rm, pid_n, pid_k, rows_total, M, N, partial_ptr, counter_ptr,
                     out_ptr, bias_ptr, stride_om, stat_ptr, HAS_BIAS, GATED, RESIDUAL, dtype,
                     BLOCK_N, BLOCK_M, SPLIT)


# ---- the GEMM (more rows) -------------------------------------------------------------------------
@triton.jit
def _int4_gemm_kernel(
    x_ptr,  # [M, K], columns in the weight's stored order (permuted beforehand)
    w_ptr,  # int32 [N, K / 8]
    scale_ptr,  # [N, K / G]
    zero_ptr,  # uint8 [N, K / G]
    bias_ptr,  # [N] (HAS_BIAS)
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    SLICE: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows past M / N read the last row again (never stored): the loads need no row mask
    rm_c = tl.minimum(rm, M - 1)
    rn_c = tl.minimum(rn, N - 1).to(tl.int64)
    w_rows = w_ptr + rn_c[:, None] * stride_wn
    s_rows = rn_c * stride_sn
    rw = tl.arange(0, BLOCK_W)
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    # (the scales load in the iteration that uses them: carried a tile ahead as in the GEMV,
    # Triton 3.9 dequantized in a blocked layout and moved each operand through shared memory)
    for u0 in range(0, K // 8, BLOCK_W):
        words = tl.load(w_rows + (u0 + rw)[None, :])
        ss, zs = _tile_scales(scale_ptr, zero_ptr, s_rows, u0, SLICE, GROUP)
        xs = _x_slices(x_ptr, stride_xm, M, x_ptr, u0, rm_c, SLICE, False, BLOCK_W)
        acc = _tile_dots(_dequant(words, _col(zs), dtype, USE_ASM), ss, xs, acc, SLICE, GROUP,
                         DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
    mask = (rn < N)[:, None] & (rm < M)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[None, :] * stride_om + rn[:, None],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---- host side ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Weight:
    """An int4 weight as the kernels read it."""
    data: torch.Tensor  # int32 [rows, K / 8]
    scales: torch.Tensor  # [rows, K / G]
    zeros: torch.Tensor  # uint8 [rows, K / G]
    perm: torch.Tensor | None  # int32 [K]
    group: int
    slice_width: int
    rows: int
    K: int


def int4_weight(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int,
                perm: torch.Tensor | None) -> _Weight:
    rows, K = qweight.shape[0], 8 * qweight.shape[1]
    if qweight.dtype != torch.int32 or qweight.stride(1) != 1:
        raise ValueError("qweight must be a row-major int32 [N, K / 8]")
    G = K if group_size == -1 else group_size
    S = reference.int4_slice_width(K, G)
    if S < MIN_SLICE:
        raise ValueError(f"the Triton int4 kernels need in_features a multiple of {8 * MIN_SLICE} "
                         f"and a group size that is a multiple of {MIN_SLICE}; got {K} and {G}")
    reference.check_int4_scales(scales, qzeros, rows, K, G)
    if perm is not None:
        if perm.shape != (K,):
            raise ValueError(f"perm must have shape ({K},), got {tuple(perm.shape)}")
        perm = perm.to(torch.int32).contiguous()
    return _Weight(qweight, scales.contiguous(), qzeros.contiguous(), perm, G, S, rows, K)


def _use_asm(x: torch.Tensor, asm: bool | None) -> bool:
    """The PTX dequantization, for 16-bit x only: on NVIDIA GPUs (not ROCm's "cuda" devices)
    where the config leaves it to the device (None), or where it asks for it (True: compiling
    for an NVIDIA target from another device)."""
    if x.dtype not in (torch.float16, torch.bfloat16) or asm is False:
        return False
    return asm or (x.device.type == "cuda" and torch.version.hip is None)


def _check_config(w: _Weight, block_w: int) -> None:
    if block_w < MIN_SLICE or w.slice_width % block_w:
        raise ValueError(f"a tile of {block_w} words must divide the slice width {w.slice_width} "
                         f"and be at least {MIN_SLICE}")


def _counters(device: torch.device) -> torch.Tensor:
    return zeroed_counters("int4 gemv split-K", MAX_SPLIT_TILES, device)


def _launch_gemv(x: torch.Tensor, w: _Weight, bias: torch.Tensor | None,
                 config: Int4GemvConfig | None, gated: bool = False, rms: RmsInput | None = None,
                 residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if rms is not None:
        # normalised by a launch of its own: folded into x's slices the GEMV ran far slower
        x = rms_norm(x, rms[1], rms[2])
    io = gemv_io(x, w.rows, w.K, bias, gated, None, residual, out_dtype, GEMV_MAX_ROWS,
                 "the int4 GEMV")
    if io.done:
        return io.out.view(*x.shape[:-1], io.N), None
    x2, out, M, N, K, rows = io.x2, io.out, io.M, io.N, w.K, w.rows
    cfg = config or choose_gemv_config(M, rows, K, w.slice_width, x.device)
    _check_config(w, cfg.block_w)
    assert cfg.block_n % 2 == 0 or not gated
    n_tiles = triton.cdiv(rows, cfg.block_n)
    tiles = K // 8 // cfg.block_w
    w_per_split = triton.cdiv(tiles, max(1, min(cfg.split_k, tiles))) * cfg.block_w
    split = triton.cdiv(K // 8, w_per_split)
    partial, stat = gemv_buffers(split, n_tiles, M, rows, out, residual is not None)
    use_pdl = pdl_enabled(x.device)
    _int4_gemv_kernel[(n_tiles, split)](
        x2, w.data, w.scales, w.zeros, w.perm if w.perm is not None else w.data,
        bias if bias is not None else out, out, partial, _counters(x.device),
        stat if stat is not None else out,
        M, N, K, w_per_split, x2.stride(0), w.data.stride(0), w.scales.stride(0), out.stride(0),
        SLICE=w.slice_width,
        GROUP=w.group,
        HAS_PERM=w.perm is not None,
        HAS_BIAS=bias is not None,
        GATED=gated,
        RESIDUAL=residual is not None,
        SPLIT=split > 1,
        USE_ASM=_use_asm(x, cfg.asm),
        USE_PDL=use_pdl,
        BLOCK_M=gemv_block_m(M),
        BLOCK_N=cfg.block_n,
        BLOCK_W=cfg.block_w,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
        # a decode step reads each weight once: evicted first, keeping the caches for the rest
        W_EVICT="evict_first",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_launch(use_pdl),
    )
    return out.view(*x.shape[:-1], N), stat


# ---- the ops (the package's dispatch: the GEMV up to GEMV_MAX_ROWS rows, the GEMM beyond) ------
def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                group_size: int, perm: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                rms: RmsInput | None = None, out_dtype: torch.dtype | None = None,
                config: Int4GemvConfig | None = None) -> torch.Tensor:  # [..., N]
    """The GEMV: x @ W^T (+ bias) for up to GEMV_MAX_ROWS rows of x."""
    return _launch_gemv(x, int4_weight(qweight, scales, qzeros, group_size, perm), bias, config,
                        rms=rms, out_dtype=out_dtype)[0]


def int4_linear_silu_and_mul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                             qzeros: torch.Tensor, group_size: int, perm: torch.Tensor | None = None,
                             rms: RmsInput | None = None,
                             config: Int4GemvConfig | None = None) -> torch.Tensor:  # [..., N / 2]
    return _launch_gemv(x, int4_weight(qweight, scales, qzeros, group_size, perm), None, config,
                        gated=True, rms=rms)[0]


def int4_linear_add_residual(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                             qzeros: torch.Tensor, group_size: int, perm: torch.Tensor | None,
                             residual: torch.Tensor,
                             config: Int4GemvConfig | None = None) -> torch.Tensor:  # [T, M] fp32
    return _launch_gemv(x, int4_weight(qweight, scales, qzeros, group_size, perm), None, config,
                        residual=residual)[1]


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
              group_size: int, perm: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              config: Int4GemmConfig | None = None) -> torch.Tensor:  # [..., N]
    """The GEMM: x @ W^T (+ bias) for any number of rows (x permuted first under act-order)."""
    w = int4_weight(qweight, scales, qzeros, group_size, perm)
    K = x.shape[-1]
    if K != w.K:
        raise ValueError(f"x has {K} features but the weight has {w.K}")
    N = w.rows
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
    x2 = x.reshape(-1, K)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)  # [M, K] in the stored order
    elif x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)  # [M, N]
    if M > 0 and N > 0:
        cfg = config or choose_gemm_config(M, w.slice_width, x.device)
        _check_config(w, cfg.block_w)
        grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
        _int4_gemm_kernel[grid](
            x2, w.data, w.scales, w.zeros, bias if bias is not None else out, out,
            M, N, K, x2.stride(0), w.data.stride(0), w.scales.stride(0), out.stride(0),
            SLICE=w.slice_width,
            GROUP=w.group,
            HAS_BIAS=bias is not None,
            USE_ASM=_use_asm(x, cfg.asm),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_W=cfg.block_w,
            GROUP_M=cfg.group_m,
            DOT_PRECISION="ieee" if x.dtype == torch.float32 else None,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out.view(*x.shape[:-1], N)


__all__ = [
    "Int4GemmConfig",
    "Int4GemvConfig",
    "choose_gemm_config",
    "choose_gemv_config",
    "int4_gemm",
    "int4_linear",
    "int4_linear_add_residual",
    "int4_linear_silu_and_mul",
]
