"""Gated DeltaNet prefill in Triton: the gated delta rule over chunks of C tokens (C = 16, 32 or
64), for several sequences one after another, each from and back into its state slot. It computes
reference.chunked (see reference.py's docstring for the math) with matmuls, in four launches after
a chunk table, with no host sync.

The chunk table (`chunk_table`, a few torch ops on the device): sequence i has ceil(len_i / C)
chunks, the first at its first token, the last maybe short; chunks never cross a sequence
boundary. Chunk j of the launch belongs to sequence chunk_seq[j], whose chunks are
cu_chunks[i]:cu_chunks[i + 1]. The per-chunk grids are sized by num_tokens // C + num_seqs, a
bound on the chunk count known from the shapes alone; programs past the real count return at
once. A caller running several layers over the same sequences may build the table once
(`chunks=`).

Inside a chunk, with c_t the cumulative sum of g from the chunk's first token to t and k, q
L2-normalised (q also scaled by 1 / sqrt(Dk)):

    A = strictly-lower(beta_i k_i.k_j exp(c_i - c_j))              [C, C]
    T = (I + A)^-1,  W = T (beta k exp(c)) [C, Dk],  U = T (beta v) [C, Dv]

1. `_diag_inverse_kernel`, a program (one warp) per (16-token block of a chunk, value head):
   the block's c (stored for the later kernels) and the inverse of its diagonal block of I + A,
   D_b = (I + A_bb)^-1 [16, 16], by forward substitution a row at a time (stored, fp32). This is
   the only row-serial step; programs are small so that many share an SM.
2. `_wy_kernel`, a program per (chunk, value head): with D the block-diagonal of the D_b and
   A_off A's part below the diagonal blocks, I + A = (I + A_diag)(I + M) for M = D A_off, which
   is nilpotent over the blocks (M^(C/16) = 0), so T = (I - M)(I + M^2) D for C = 64 (I - M for
   32, D for 16): four [C, C] matmuls, no serial steps. (Its terms are the products of blocks
   that block forward substitution sums, grouped otherwise: no larger.) Then W and U (stored,
   fp32).
3. `_state_kernel`, a program per (sequence, value head, block of BV state columns), walking the
   sequence's chunks in order with the state columns S [Dk, BV] in fp32 registers:
       h[chunk] = S                      the state the chunk starts from (stored, fp32)
       V' = U - W S                      the corrections the chunk writes (stored over U)
       S = exp(c_last) S + (k exp(c_last - c))^T V'
   from the slot's state; the final S is written back to the slot. The sequential part: two
   [C, Dk] x [Dk, BV]-sized matmuls a chunk.
4. `_output_kernel`, a program per (chunk, value head, block of BV output columns):
       O = (q exp(c)) h[chunk] + ((q k^T) * G) V',   G[i, j] = exp(c_i - c_j) for j <= i, else 0

Precision: the state, the recurrence and every stored intermediate (c, D, W, U / V', h) are fp32.
Products of keys and queries (k k^T, q k^T) take the inputs as stored (bf16 products are exact)
and apply the L2 norms after. With fp32 inputs every matmul is fp32-exact ("bf16x6": each operand
split into three bf16 parts; "ieee" in the interpreter), for parity with the reference to ~1e-6;
with 16-bit inputs the fp32 operands take Triton's default input precision (TF32 on NVIDIA, fp32
on AMD), which a torch emulation of these steps (TF32 operands truncated) puts at ~1e-3 relative
error in the final states and ~2e-3 in bf16 outputs at Qwen3-Next's shape, most of the latter the
output's own rounding to bf16.

Memory: the work buffers are per token 4 * Hv * (17 + Dk + Dv) bytes (c, D, W, U) and per chunk
4 * Hv * Dk * Dv bytes (h): at Qwen3-Next's shape (Hv = 32, Dk = Dv = 128, C = 64) about 35 KB a
token plus 2 MB a chunk, 4.5 GB for 64K tokens. A caller prefilling longer prompts may cut them
into pieces: the rule resumes from the slot's state exactly.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait

CHUNK_SIZES = (16, 32, 64)


def _exact_precision() -> str:
    """The input precision of fp32-exact matmuls: "bf16x6" on tensor cores, NVIDIA and AMD alike
    ("ieee" would be exact too, but NVIDIA's is an FMA loop holding whole operand rows in
    registers); the interpreter knows only "ieee" (numpy's fp32 matmul)."""
    return "ieee" if os.environ.get("TRITON_INTERPRET") == "1" else "bf16x6"


@triton.jit
def _rnorm(x):
    """[R, D] -> [R] fp32: 1 / sqrt(each row's sum of squares + 1e-6), reference.l2norm's factor."""
    x = x.to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)


@triton.jit
def _chunk_start(seq, cu_chunks_ptr, cu_ptr, j, C: tl.constexpr):
    """Chunk j's first token and its sequence's end (one past the sequence's last token)."""
    first = tl.load(cu_chunks_ptr + seq)
    return tl.load(cu_ptr + seq) + (j - first) * C, tl.load(cu_ptr + seq + 1)


@triton.jit
def _diag_inverse_kernel(
    k_ptr,  # [T, Hk, Dk], rows stride_kt apart
    g_ptr,  # [T, Hv] log decay, rows stride_gt apart
    beta_ptr,  # [T, Hv], rows stride_bt apart
    cu_ptr,  # [N + 1] the sequences' token offsets
    chunk_seq_ptr,  # [max_chunks] int32: each chunk's sequence (N past the real chunks)
    cu_chunks_ptr,  # [N + 1] int32: the sequences' chunk offsets
    gc_ptr,  # [T, Hv] fp32 out: c, g's cumulative sum from the chunk's first token
    d_ptr,  # [T, Hv, 16] fp32 out: each token's row of its block's D_b = (I + A_bb)^-1
    N,
    HV,
    DK,
    HEADS_PER_K,  # value heads per key head
    stride_kt,
    stride_gt,
    stride_bt,
    C: tl.constexpr,
    BK: tl.constexpr,  # >= DK
    DOT: tl.constexpr,  # tl.dot's input precision (None: the target's default)
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    j = tl.program_id(0) // (C // 16)  # the chunk
    b = tl.program_id(0) % (C // 16)  # the block of 16 tokens in it
    h = tl.program_id(1)
    pdl_wait(USE_PDL)
    seq = tl.load(chunk_seq_ptr + j)
    if seq >= N:  # past the real chunks
        return
    t0, eos = _chunk_start(seq, cu_chunks_ptr, cu_ptr, j, C)
    tb = t0 + b * 16
    if tb >= eos:  # a short chunk's block past the sequence's end
        return
    rc = tl.arange(0, C)
    r16 = tl.arange(0, 16)
    rows = (tb + r16).to(tl.int64)
    ok = tb + r16 < eos
    rk = tl.arange(0, BK)

    # c on the block's rows: the chunk's g before the block, then the block's own cumulative sum
    g_before = tl.load(g_ptr + (t0 + rc).to(tl.int64) * stride_gt + h, mask=rc < b * 16, other=0.0)
    g = tl.load(g_ptr + rows * stride_gt + h, mask=ok, other=0.0).to(tl.float32)
    c = tl.sum(g_before.to(tl.float32), axis=0) + tl.cumsum(g, axis=0)  # [16]
    tl.store(gc_ptr + rows * HV + h, c, mask=ok)

    beta = tl.load(beta_ptr + rows * stride_bt + h, mask=ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + rows[:, None] * stride_kt + (h // HEADS_PER_K) * DK + rk[None, :],
                mask=ok[:, None] & (rk < DK)[None, :], other=0.0)  # [16, BK] as stored
    r = _rnorm(k)  # [16]: the normalised k_i is k_i * r_i
    lower = r16[:, None] > r16[None, :]
    decay = tl.exp(tl.where(lower, c[:, None] - c[None, :], 0.0))
    kk = tl.dot(k, tl.trans(k), input_precision=DOT)  # [16, 16]
    a = tl.where(lower, (beta * r)[:, None] * kk * r[None, :] * decay, 0.0)  # A_bb, zero rows past eos

    # forward substitution: row i of (I + a)^-1 is e_i - a_i (its rows above)
    d = (r16[:, None] == r16[None, :]).to(tl.float32)
    for i in range(1, 16):
        a_i = tl.sum(tl.where(r16[:, None] == i, a, 0.0), axis=0)  # [16], zero from column i on
        d = tl.where(r16[:, None] == i, d - tl.sum(a_i[:, None] * d, axis=0)[None, :], d)
    tl.store(d_ptr + (rows[:, None] * HV + h) * 16 + r16[None, :], d, mask=ok[:, None])


@triton.jit
def _wy_kernel(
    k_ptr,  # [T, Hk, Dk], rows stride_kt apart
    v_ptr,  # [T, Hv, Dv], rows stride_vt apart
    beta_ptr,  # [T, Hv], rows stride_bt apart
    cu_ptr,  # [N + 1]
    chunk_seq_ptr,  # [max_chunks] int32
    cu_chunks_ptr,  # [N + 1] int32
    gc_ptr,  # [T, Hv] fp32: c
    d_ptr,  # [T, Hv, 16] fp32: the diagonal blocks' inverses
    w_ptr,  # [T, Hv, Dk] fp32 out
    u_ptr,  # [T, Hv, Dv] fp32 out
    N,
    HV,
    DK,
    DV,
    HEADS_PER_K,
    stride_kt,
    stride_vt,
    stride_bt,
    C: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DOT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    j = tl.program_id(0)
    h = tl.program_id(1)
    pdl_wait(USE_PDL)
    seq = tl.load(chunk_seq_ptr + j)
    if seq >= N:
        return
    t0, eos = _chunk_start(seq, cu_chunks_ptr, cu_ptr, j, C)
    rc = tl.arange(0, C)
    rows = (t0 + rc).to(tl.int64)
    ok = t0 + rc < eos
    rk = tl.arange(0, BK)
    k_ok = ok[:, None] & (rk < DK)[None, :]

    c = tl.load(gc_ptr + rows * HV + h, mask=ok, other=0.0)  # [C]
    beta = tl.load(beta_ptr + rows * stride_bt + h, mask=ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + rows[:, None] * stride_kt + (h // HEADS_PER_K) * DK + rk[None, :], mask=k_ok,
                other=0.0)  # [C, BK] as stored; rows past the sequence are zeros
    r = _rnorm(k)  # [C]

    # T = (I + M)^-1 D with M = D A_off: sum_n (-M)^n D, n < C / 16, as a product of few factors
    block = rc // 16
    same_block = block[:, None] == block[None, :]
    d = tl.load(d_ptr + (rows[:, None] * HV + h) * 16 + (rc % 16)[None, :], mask=ok[:, None] & same_block,
                other=0.0)  # [C, C] block-diagonal
    t = d
    if C > 16:
        below = block[:, None] > block[None, :]
        # rows past the sequence (c = 0 there) kept out of exp: their exp(0 - c_j) may overflow
        decay = tl.exp(tl.where(below & ok[:, None], c[:, None] - c[None, :], 0.0))
        kk = tl.dot(k, tl.trans(k), input_precision=DOT)  # [C, C]
        a_off = tl.where(below, (beta * r)[:, None] * kk * r[None, :] * decay, 0.0)
        m = tl.dot(d, a_off, input_precision=DOT)  # [C, C], zero on and above the diagonal blocks
        t = d - tl.dot(m, d, input_precision=DOT)  # (I - M) D
        if C > 32:
            m = tl.dot(m, m, input_precision=DOT)  # M^2
            t += tl.dot(m, t, input_precision=DOT)  # (I + M^2)(I - M) D

    kw = k.to(tl.float32) * (beta * tl.exp(c) * r)[:, None]
    w = tl.dot(t, kw, input_precision=DOT)  # [C, BK]
    tl.store(w_ptr + (rows[:, None] * HV + h) * DK + rk[None, :], w, mask=k_ok)
    for v0 in range(0, DV, BV):
        rv = v0 + tl.arange(0, BV)
        v_ok = ok[:, None] & (rv < DV)[None, :]
        v = tl.load(v_ptr + rows[:, None] * stride_vt + h * DV + rv[None, :], mask=v_ok,
                    other=0.0).to(tl.float32)
        u = tl.dot(t, v * beta[:, None], input_precision=DOT)  # [C, BV]
        tl.store(u_ptr + (rows[:, None] * HV + h) * DV + rv[None, :], u, mask=v_ok)


@triton.jit
def _state_kernel(
    k_ptr,  # [T, Hk, Dk], rows stride_kt apart
    gc_ptr,  # [T, Hv] fp32
    w_ptr,  # [T, Hv, Dk] fp32
    u_ptr,  # [T, Hv, Dv] fp32: U in, V' = U - W S out
    cu_ptr,  # [N + 1]
    cu_chunks_ptr,  # [N + 1] int32
    states_ptr,  # [num_slots, Hv, Dk, Dv] fp32, read and written in place
    slots_ptr,  # [N]
    h_ptr,  # [max_chunks, Hv, Dk, Dv] fp32 out: each chunk's starting state
    HV,
    DK,
    DV,
    HEADS_PER_K,
    stride_kt,
    C: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DOT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    seq = tl.program_id(0)
    h = tl.program_id(1)
    rv = tl.program_id(2) * BV + tl.arange(0, BV)
    rk = tl.arange(0, BK)
    rc = tl.arange(0, C)
    s_ok = (rk < DK)[:, None] & (rv < DV)[None, :]
    s_offs = rk[:, None] * DV + rv[None, :]  # within a [Dk, Dv] state
    pdl_wait(USE_PDL)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    first = tl.load(cu_chunks_ptr + seq).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    state = states_ptr + (slot * HV + h) * DK * DV + s_offs
    s = tl.load(state, mask=s_ok, other=0.0)  # [BK, BV] fp32
    for i in range(tl.cdiv(eos - bos, C)):
        t0 = bos + i * C
        rows = (t0 + rc).to(tl.int64)
        ok = t0 + rc < eos
        k_ok = ok[:, None] & (rk < DK)[None, :]
        v_ok = ok[:, None] & (rv < DV)[None, :]
        tl.store(h_ptr + ((first + i) * HV + h) * DK * DV + s_offs, s, mask=s_ok)
        w = tl.load(w_ptr + (rows[:, None] * HV + h) * DK + rk[None, :], mask=k_ok, other=0.0)
        u_ptrs = u_ptr + (rows[:, None] * HV + h) * DV + rv[None, :]
        v_new = tl.load(u_ptrs, mask=v_ok, other=0.0) - tl.dot(w, s, input_precision=DOT)  # [C, BV]
        tl.store(u_ptrs, v_new, mask=v_ok)
        c = tl.load(gc_ptr + rows * HV + h, mask=ok, other=0.0)  # [C]
        c_last = tl.load(gc_ptr + (tl.minimum(t0 + C, eos) - 1).to(tl.int64) * HV + h)
        k = tl.load(k_ptr + rows[:, None] * stride_kt + (h // HEADS_PER_K) * DK + rk[None, :], mask=k_ok,
                    other=0.0)
        k = k.to(tl.float32) * (_rnorm(k) * tl.exp(c_last - c))[:, None]  # [C, BK]
        s = s * tl.exp(c_last) + tl.dot(tl.trans(k), v_new, input_precision=DOT)
    tl.store(state, s, mask=s_ok)


@triton.jit
def _output_kernel(
    q_ptr,  # [T, Hk, Dk], rows stride_qt apart
    k_ptr,  # [T, Hk, Dk], rows stride_kt apart
    gc_ptr,  # [T, Hv] fp32
    u_ptr,  # [T, Hv, Dv] fp32: V'
    h_ptr,  # [max_chunks, Hv, Dk, Dv] fp32
    cu_ptr,  # [N + 1]
    chunk_seq_ptr,  # [max_chunks] int32
    cu_chunks_ptr,  # [N + 1] int32
    out_ptr,  # [T, Hv, Dv]
    N,
    HV,
    DK,
    DV,
    HEADS_PER_K,
    stride_qt,
    stride_kt,
    scale,
    C: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DOT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    j = tl.program_id(0)
    h = tl.program_id(1)
    rv = tl.program_id(2) * BV + tl.arange(0, BV)
    pdl_wait(USE_PDL)
    seq = tl.load(chunk_seq_ptr + j)
    if seq >= N:
        return
    t0, eos = _chunk_start(seq, cu_chunks_ptr, cu_ptr, j, C)
    rc = tl.arange(0, C)
    rk = tl.arange(0, BK)
    rows = (t0 + rc).to(tl.int64)
    ok = t0 + rc < eos
    k_ok = ok[:, None] & (rk < DK)[None, :]
    v_ok = ok[:, None] & (rv < DV)[None, :]
    key_head = (h // HEADS_PER_K) * DK + rk[None, :]
    q = tl.load(q_ptr + rows[:, None] * stride_qt + key_head, mask=k_ok, other=0.0)  # [C, BK] as stored
    k = tl.load(k_ptr + rows[:, None] * stride_kt + key_head, mask=k_ok, other=0.0)
    rq = _rnorm(q) * scale  # [C]
    c = tl.load(gc_ptr + rows * HV + h, mask=ok, other=0.0)  # [C]
    s = tl.load(h_ptr + (j.to(tl.int64) * HV + h) * DK * DV + rk[:, None] * DV + rv[None, :],
                mask=(rk < DK)[:, None] & (rv < DV)[None, :], other=0.0)  # [BK, BV]
    v_new = tl.load(u_ptr + (rows[:, None] * HV + h) * DV + rv[None, :], mask=v_ok, other=0.0)
    causal = rc[:, None] >= rc[None, :]
    decay = tl.exp(tl.where(causal & ok[:, None], c[:, None] - c[None, :], 0.0))  # see _wy_kernel
    qk = tl.dot(q, tl.trans(k), input_precision=DOT)  # [C, C]
    p = tl.where(causal, rq[:, None] * qk * _rnorm(k)[None, :] * decay, 0.0)
    o = tl.dot(q.to(tl.float32) * (rq * tl.exp(c))[:, None], s, input_precision=DOT)  # [C, BV]
    o += tl.dot(p, v_new, input_precision=DOT)
    tl.store(out_ptr + (rows[:, None] * HV + h) * DV + rv[None, :], o.to(out_ptr.dtype.element_ty),
             mask=v_ok)


def chunk_table(cu_seqlens: torch.Tensor, num_tokens: int, chunk_size: int = 64
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk_seq [num_tokens // chunk_size + num_seqs] int32, cu_chunks [num_seqs + 1] int32):
    each chunk's sequence (num_seqs for the entries past the real chunks) and the sequences'
    chunk offsets, built on cu_seqlens' device without a host sync (a few small torch ops).
    The same for every layer of a forward: a caller may build it once and pass it to each."""
    num_seqs = cu_seqlens.shape[0] - 1
    cu = cu_seqlens.long()
    counts = (cu[1:] - cu[:-1] + chunk_size - 1) // chunk_size  # [N]
    cu_chunks = torch.zeros(num_seqs + 1, dtype=torch.int64, device=cu.device)
    cu_chunks[1:] = counts.cumsum(0)
    max_chunks = num_tokens // chunk_size + num_seqs  # sum ceil(l / C) <= sum (l // C + 1)
    chunk_ids = torch.arange(max_chunks, dtype=torch.int64, device=cu.device)
    chunk_seq = torch.searchsorted(cu_chunks[1:], chunk_ids, right=True)  # chunk ends at or before j
    return chunk_seq.to(torch.int32), cu_chunks.to(torch.int32)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with its last dims packed (the kernels take any stride between tokens only)."""
    packed = x.stride(-1) == 1 and (x.dim() < 3 or x.stride(-2) == x.shape[-1])
    return x if packed else x.contiguous()


def gated_delta_rule(
    q: torch.Tensor,  # [num_tokens, Hk, Dk], the tokens of several sequences, one after another
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv] fp32 log decay
    beta: torch.Tensor,  # [num_tokens, Hv]
    cu_seqlens: torch.Tensor,  # [num_seqs + 1] int32 on the device: sequence i is cu[i]:cu[i + 1]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [num_seqs] int on the device: sequence i's state slot
    chunk_size: int = 64,
    chunks: tuple[torch.Tensor, torch.Tensor] | None = None,  # chunk_table(cu_seqlens, T, chunk_size)
) -> torch.Tensor:  # [num_tokens, Hv, Dv] in v's dtype
    """reference.gated_delta_rule on the GPU: each sequence's tokens from its slot's state, in
    chunks of `chunk_size` (16, 32 or 64) tokens from its first, the state after its last token
    written back to the slot. Four kernel launches after the chunk table (built here unless
    given), no host sync: the grids depend on the shapes only. cu_seqlens must end at num_tokens;
    sequences may be empty (their slot is left as it was); no two sequences may share a slot.
    q, k, v, g and beta may be views with any stride between tokens."""
    num_tokens, num_k_heads, dk = q.shape
    _, num_v_heads, dv = v.shape
    num_seqs = cu_seqlens.shape[0] - 1
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"{num_v_heads} value heads do not share {num_k_heads} key heads evenly")
    if k.shape != q.shape or v.shape[0] != num_tokens or g.shape != (num_tokens, num_v_heads) \
            or beta.shape != g.shape:
        raise ValueError(f"shapes do not agree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if (states.shape[1:] != (num_v_heads, dk, dv) or states.dtype != torch.float32
            or not states.is_contiguous()):
        raise ValueError(f"states must be contiguous fp32 [num_slots, {num_v_heads}, {dk}, {dv}], got "
                         f"{states.dtype} {tuple(states.shape)}")
    out = torch.empty((num_tokens, num_v_heads, dv), dtype=v.dtype, device=v.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    q, k, v, g, beta = map(_rows, (q, k, v, g, beta))
    chunk_seq, cu_chunks = chunks if chunks is not None else chunk_table(cu_seqlens, num_tokens, chunk_size)
    max_chunks = chunk_seq.shape[0]
    device, f32 = v.device, torch.float32
    gc = torch.empty((num_tokens, num_v_heads), dtype=f32, device=device)
    d = torch.empty((num_tokens, num_v_heads, 16), dtype=f32, device=device)
    w = torch.empty((num_tokens, num_v_heads, dk), dtype=f32, device=device)
    u = torch.empty((num_tokens, num_v_heads, dv), dtype=f32, device=device)  # U, then V'
    h = torch.empty((max_chunks, num_v_heads, dk, dv), dtype=f32, device=device)

    block_k = max(16, triton.next_power_of_2(dk))
    block_v = min(64, max(16, triton.next_power_of_2(dv)))
    # the state walk, the sequential part, in 32-column blocks: more programs for a few long
    # sequences, and its [Dk, 32] state and [C, Dk] tiles fit 4 warps' registers
    state_block_v = min(32, block_v)
    exact = all(x.dtype == torch.float32 for x in (q, k, v))
    common = dict(C=chunk_size, BK=block_k, DOT=_exact_precision() if exact else None)
    use_pdl = pdl_enabled(device)
    pdl = dict(USE_PDL=use_pdl, **pdl_launch(use_pdl))
    heads_per_k = num_v_heads // num_k_heads

    _diag_inverse_kernel[(max_chunks * (chunk_size // 16), num_v_heads)](
        k, g, beta, cu_seqlens, chunk_seq, cu_chunks, gc, d, num_seqs, num_v_heads, dk, heads_per_k,
        k.stride(0), g.stride(0), beta.stride(0), **common, num_warps=1, **pdl,
    )
    _wy_kernel[(max_chunks, num_v_heads)](
        k, v, beta, cu_seqlens, chunk_seq, cu_chunks, gc, d, w, u, num_seqs, num_v_heads, dk, dv,
        heads_per_k, k.stride(0), v.stride(0), beta.stride(0), BV=block_v, **common, num_warps=4, **pdl,
    )
    _state_kernel[(num_seqs, num_v_heads, triton.cdiv(dv, state_block_v))](
        k, gc, w, u, cu_seqlens, cu_chunks, states, slots, h, num_v_heads, dk, dv, heads_per_k,
        k.stride(0), BV=state_block_v, **common, num_warps=4, **pdl,
    )
    _output_kernel[(max_chunks, num_v_heads, triton.cdiv(dv, block_v))](
        q, k, gc, u, h, cu_seqlens, chunk_seq, cu_chunks, out, num_seqs, num_v_heads, dk, dv,
        heads_per_k, q.stride(0), k.stride(0), dk**-0.5, BV=block_v, **common, num_warps=4, **pdl,
    )
    return out
