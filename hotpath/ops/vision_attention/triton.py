"""Varlen attention without a mask: FlashAttention-style tiles with an online softmax; and the
rotary before it, in one pass over q and k.

One program handles BLOCK_M consecutive queries of one segment and one head, and walks the keys of
that segment only, BLOCK_N at a time; only the segment's last key tile needs a bound. The running
softmax is kept in fp32 in log2 units (exp2), as in hotpath/ops/attention/triton_prefill.py, which
this kernel is that one without the paged cache and without the causal mask. A head_dim that is no
power of two runs as two dots, a power-of-two part and a masked remainder (head_dim_split).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.attention.triton_common import LOG2E, dot_precision, next_power_of_2


@triton.jit
def _load(ptrs, row_ok, col_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    if MASK_ROWS and MASK_COLS:
        x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    elif MASK_ROWS:
        x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    elif MASK_COLS:
        x = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _attend(
    acc,  # [BLOCK_M, DIM_LO] fp32: head dims [0, DIM_LO)
    acc_hi,  # [BLOCK_M, DIM_HI] fp32: head dims [DIM_LO, DIM_LO + DIM_HI) (used only when HAS_HI)
    l_i,  # [BLOCK_M] fp32
    m_i,  # [BLOCK_M] fp32
    q,  # [BLOCK_M, DIM_LO]
    q_hi,  # [BLOCK_M, DIM_HI]
    k_ptrs,  # [BLOCK_N, DIM_LO] pointers to the tile's keys
    k_hi_ptrs,  # [BLOCK_N, DIM_HI]
    v_ptrs,
    v_hi_ptrs,
    n_ok,  # [BLOCK_N] bool: keys inside the segment (used only when MASK_N)
    lo_ok,  # [DIM_LO] bool: real head dims (used only when MASK_LO)
    hi_ok,  # [DIM_HI] bool
    scale_log2,
    MASK_N: tl.constexpr,
    MASK_LO: tl.constexpr,
    HAS_HI: tl.constexpr,
    PRECISION: tl.constexpr,
):
    k = _load(k_ptrs, n_ok, lo_ok, MASK_N, MASK_LO)
    v = _load(v_ptrs, n_ok, lo_ok, MASK_N, MASK_LO)
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
    if HAS_HI:
        k_hi = _load(k_hi_ptrs, n_ok, hi_ok, MASK_N, True)
        v_hi = _load(v_hi_ptrs, n_ok, hi_ok, MASK_N, True)
        s = tl.dot(q_hi, tl.trans(k_hi.to(q.dtype)), s, input_precision=PRECISION)
    s = s * scale_log2
    if MASK_N:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    # every tile holds at least one key of the segment, so m_new is finite
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p, v.to(q.dtype), input_precision=PRECISION)
    if HAS_HI:
        acc_hi = acc_hi * alpha[:, None] + tl.dot(p, v_hi.to(q.dtype), input_precision=PRECISION)
    return acc, acc_hi, l_i, m_new


@triton.jit
def _varlen_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cu_seqlens_ptr,
    out_ptr,
    scale_log2,  # softmax scale * log2(e)
    stride_qt,
    stride_kt,
    stride_vt,
    stride_ot,
    M_BLOCKS,  # query tiles of the longest segment
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_LO: tl.constexpr,  # see head_dim_split
    DIM_HI: tl.constexpr,
    PRECISION: tl.constexpr,
):
    MASK_LO: tl.constexpr = HEAD_DIM < DIM_LO
    HAS_HI: tl.constexpr = HEAD_DIM > DIM_LO
    # query tiles of one segment are neighbours in the launch (they read the same keys), and
    # segments on the grid's first axis have no 65535 limit
    seg = tl.program_id(0) // M_BLOCKS
    m_block = tl.program_id(0) % M_BLOCKS
    head = tl.program_id(1)
    start = tl.load(cu_seqlens_ptr + seg)
    seq_len = tl.load(cu_seqlens_ptr + seg + 1) - start
    if m_block * BLOCK_M >= seq_len:
        return

    m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < seq_len
    d = tl.arange(0, DIM_LO)
    d_hi = DIM_LO + tl.arange(0, DIM_HI)
    lo_ok, hi_ok = d < HEAD_DIM, d_hi < HEAD_DIM
    token = (start + m).to(tl.int64)
    q_rows = q_ptr + token[:, None] * stride_qt + head * HEAD_DIM
    q = _load(q_rows + d[None, :], m_ok, lo_ok, True, MASK_LO)
    q_hi = _load(q_rows + d_hi[None, :], m_ok, hi_ok, True, True) if HAS_HI else q

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_LO], tl.float32)
    acc_hi = tl.zeros([BLOCK_M, DIM_HI], tl.float32)
    n = tl.arange(0, BLOCK_N)
    key = start.to(tl.int64) + n
    k_rows = k_ptr + key[:, None] * stride_kt + head * HEAD_DIM
    v_rows = v_ptr + key[:, None] * stride_vt + head * HEAD_DIM
    full_end = (seq_len // BLOCK_N) * BLOCK_N  # tiles below lie wholly inside the segment
    for _ in range(0, full_end, BLOCK_N):
        acc, acc_hi, l_i, m_i = _attend(
            acc, acc_hi, l_i, m_i, q, q_hi, k_rows + d[None, :], k_rows + d_hi[None, :], v_rows + d[None, :],
            v_rows + d_hi[None, :], n < BLOCK_N, lo_ok, hi_ok, scale_log2, False, MASK_LO, HAS_HI, PRECISION)
        k_rows += BLOCK_N * stride_kt
        v_rows += BLOCK_N * stride_vt
    if full_end < seq_len:
        acc, acc_hi, l_i, m_i = _attend(
            acc, acc_hi, l_i, m_i, q, q_hi, k_rows + d[None, :], k_rows + d_hi[None, :], v_rows + d[None, :],
            v_rows + d_hi[None, :], n < seq_len - full_end, lo_ok, hi_ok, scale_log2, True, MASK_LO, HAS_HI,
            PRECISION)

    out_rows = out_ptr + token[:, None] * stride_ot + head * HEAD_DIM
    out_ty = out_ptr.dtype.element_ty
    tl.store(out_rows + d[None, :], (acc / l_i[:, None]).to(out_ty), mask=m_ok[:, None] & lo_ok[None, :])
    if HAS_HI:
        tl.store(out_rows + d_hi[None, :], (acc_hi / l_i[:, None]).to(out_ty), mask=m_ok[:, None] & hi_ok[None, :])


def head_dim_split(head_dim: int) -> tuple[int, int]:
    """(DIM_LO, DIM_HI): the kernel's dots run over a power-of-two part of the head dims and, for
    a head_dim that is no power of two, a second, narrower one (at least 16 wide, as tl.dot
    needs), masked to head_dim: Qwen3-VL-8B's 72 as 64 + 16 rather than 128 (twice as fast on
    an H100)."""
    lo = max(16, 1 << (head_dim.bit_length() - 1))
    hi = max(16, next_power_of_2(head_dim - lo)) if head_dim > lo else 16
    return lo, hi


def default_config(head_dim: int, dtype: torch.dtype, max_seqlen: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): the fastest of a sweep on an H100 in bf16 at
    head_dim 64 and 72, for a 4096-patch image and for a video of 576-patch frames (smaller query
    tiles give short segments more programs)."""
    if dtype == torch.float32:
        return 32, 32, 4, 2
    width = sum(head_dim_split(head_dim))
    if width > 128:
        return 64, 32, 4, 2
    if max_seqlen >= 2048:
        return 128, 128 if width <= 64 else 64, 4, 3
    return 64, 64, 4, 3


def varlen_attention(
    q: torch.Tensor,  # [total_tokens, num_heads, head_dim] (any token stride; else copied)
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,  # [num_segments + 1] int32
    max_seqlen: int,
    scale: float,
    *,
    config: tuple[int, int, int, int] | None = None,  # tuning: (BLOCK_M, BLOCK_N, warps, stages)
) -> torch.Tensor:  # [total_tokens, num_heads, head_dim]
    """Same contract as reference.varlen_attention."""
    total_tokens, num_heads, head_dim = q.shape
    # a token's heads side by side: the kernel offsets a head by head * HEAD_DIM, a constant
    # whose factors of two let it vectorise the loads (from a stride argument, which Triton knows
    # only as a multiple of 16 or not, head_dim 72 loaded element by element: twice as slow)
    q, k, v = (x if x.stride(1) == head_dim and x.stride(2) == 1 else x.contiguous() for x in (q, k, v))
    dim_lo, dim_hi = head_dim_split(head_dim)
    block_m, block_n, num_warps, num_stages = config or default_config(head_dim, q.dtype, max_seqlen)
    out = torch.empty((total_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    num_segments = cu_seqlens.shape[0] - 1
    if total_tokens == 0 or num_segments == 0:
        return out
    m_blocks = triton.cdiv(max_seqlen, block_m)
    _varlen_attention_kernel[(num_segments * m_blocks, num_heads)](
        q, k, v, cu_seqlens, out, scale * LOG2E,
        q.stride(0), k.stride(0), v.stride(0), out.stride(0), m_blocks,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, DIM_LO=dim_lo, DIM_HI=dim_hi,
        PRECISION=dot_precision(q.dtype), num_warps=num_warps, num_stages=num_stages,
    )
    return out


@triton.jit
def _rotary_kernel(
    x_ptr,  # [T, R, D], strides (stride_xt, D, 1)
    cos_ptr,  # [T, D] fp32, contiguous
    sin_ptr,
    out_ptr,  # [T, R, D] contiguous
    R,
    stride_xt,
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,  # rows (heads of q and k) a program rotates
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK_D)
    HALF: tl.constexpr = HEAD_DIM // 2
    first_half = d < HALF
    d_ok = d < HEAD_DIM
    mask = (r < R)[:, None] & d_ok[None, :]
    rows = r[:, None] * HEAD_DIM
    x_rows = x_ptr + t * stride_xt + rows
    x = tl.load(x_rows + d[None, :], mask=mask, other=0.0).to(tl.float32)
    # rotate-half: the partner of dim d is d + D/2 (negated) in the first half, d - D/2 in the second
    partner = tl.load(x_rows + tl.where(first_half, d + HALF, d - HALF)[None, :], mask=mask, other=0.0)
    partner = partner.to(tl.float32)
    cos = tl.load(cos_ptr + t * HEAD_DIM + d, mask=d_ok, other=0.0)
    sin = tl.load(sin_ptr + t * HEAD_DIM + d, mask=d_ok, other=0.0)
    rotated = tl.where(first_half[None, :], -partner, partner)
    out = x * cos[None, :] + rotated * sin[None, :]
    tl.store(out_ptr + t * R * HEAD_DIM + rows + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, rows, head_dim] (any token stride; else copied)
    cos: torch.Tensor,  # [num_tokens, head_dim] fp32
    sin: torch.Tensor,
) -> torch.Tensor:  # [num_tokens, rows, head_dim] in x's dtype, contiguous
    """Same contract as reference.apply_rotary."""
    num_tokens, num_rows, head_dim = x.shape
    if x.stride(1) != head_dim or x.stride(2) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((num_tokens, num_rows, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block_d = next_power_of_2(head_dim)
    rows = min(next_power_of_2(num_rows), max(1, 4096 // block_d))  # ~4K elements a program
    _rotary_kernel[(num_tokens, triton.cdiv(num_rows, rows))](
        x, cos, sin, out, num_rows, x.stride(0),
        HEAD_DIM=head_dim, ROWS=rows, BLOCK_D=block_d, num_warps=4,
    )
    return out
