"""Gated DeltaNet decode step in Triton: every sequence of the step contributes one token, and two
launches do the whole layer's recurrence for all of them, with no host sync (a CUDA graph can
hold them):

1. `_conv_step_kernel`, a program per (sequence, block of channels): the causal conv1d over the
   channel's last K - 1 inputs (the slot's conv state) and the new one, SiLU, and the state
   shifted by one input;
2. `_delta_step_kernel`, a program per (sequence, value head, block of the head's Dv columns):
   q and k of the head's key head L2-normalised in registers (q scaled by 1 / sqrt(Dk)), the gates
   g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), then on the slot's state columns
   S [Dk, BLOCK_V] (fp32): S *= exp(g); S += k (beta (v - S^T k))^T; o = S^T q.

A sequence whose token is at position 0 (context length 1) starts from zero states, whatever its
slot held. The reference is reference.causal_conv1d then reference.recurrent, a sequence at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait


@triton.jit
def _conv_step_kernel(
    x_ptr,  # [N, C] (row stride stride_xn): the step's pre-conv q, k, v (one token a sequence)
    w_ptr,  # [C, K]
    conv_ptr,  # [num_slots, C, K - 1], read and shifted in place
    slots_ptr,  # [N] int64
    ctx_ptr,  # [N] int32: context lengths (1: the sequence's first token)
    y_ptr,  # [N, C]
    C,
    stride_xn,
    K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    n = tl.program_id(0).to(tl.int64)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rj = tl.arange(0, BLOCK_K)  # taps: K - 1 from the state, then the new input
    c_ok = rc < C
    slot = tl.load(slots_ptr + n)
    resume = tl.load(ctx_ptr + n) > 1  # else the sequence's first token: nothing before it
    state = conv_ptr + slot * C * (K - 1) + rc[:, None] * (K - 1) + rj[None, :]
    in_state = c_ok[:, None] & (rj < K - 1)[None, :]
    old = tl.load(state, mask=in_state, other=0.0)  # [BLOCK_C, BLOCK_K]
    old = tl.where(resume, old, tl.zeros_like(old))
    w = tl.load(w_ptr + rc[:, None] * K + rj[None, :], mask=c_ok[:, None] & (rj < K)[None, :], other=0.0)
    # the slot's state (earlier forwards wrote it) and the weights are read before the wait
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + n * stride_xn + rc, mask=c_ok, other=0.0)
    window = tl.where((rj == K - 1)[None, :], x[:, None], old)
    acc = tl.sum(window.to(tl.float32) * w.to(tl.float32), axis=1)
    # rounded to the weight's dtype before the activation, as torch's conv1d then SiLU
    acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + n * C + rc, y.to(y_ptr.dtype.element_ty), mask=c_ok)
    # the state keeps the last K - 1 inputs, the window's columns 1..K-1 (a program owns its
    # channels' state rows: nothing else reads them meanwhile)
    tl.store(state, _shift_left(window, rj, BLOCK_K).to(conv_ptr.dtype.element_ty), mask=in_state)


@triton.jit
def _shift_left(window, rj, BLOCK_K: tl.constexpr):
    """[BLOCK_C, BLOCK_K] -> column j holds window's column j + 1 (the last column: zeros)."""
    out = tl.zeros(window.shape, dtype=window.dtype)
    for j in tl.static_range(BLOCK_K - 1):
        col = tl.sum(tl.where((rj == j + 1)[None, :], window, 0.0), axis=1)
        out = tl.where((rj == j)[None, :], col[:, None], out)
    return out


@triton.jit
def _delta_step_kernel(
    y_ptr,  # [N, C]: the conv's output, [q (Hk * Dk) | k (Hk * Dk) | v (Hv * Dv)]
    a_ptr,  # [N, Hv]
    b_ptr,  # [N, Hv]
    a_log_ptr,  # [Hv]
    dt_bias_ptr,  # [Hv]
    state_ptr,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots_ptr,  # [N] int64
    ctx_ptr,  # [N] int32
    out_ptr,  # [N, Hv, Dv]
    C,
    HV,
    DV,
    HEADS_PER_K,  # value heads per key head
    stride_an,
    stride_bn,
    DK: tl.constexpr,
    BLOCK_V: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    rv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    rk = tl.arange(0, DK)
    v_ok = rv < DV
    hk = h // HEADS_PER_K
    key_dim = C - HV * DV  # 2 * Hk * Dk
    # the slot's state (earlier forwards wrote it) and the gates' parameters before the wait
    slot = tl.load(slots_ptr + n)
    resume = tl.load(ctx_ptr + n) > 1
    s_ptrs = state_ptr + ((slot * HV + h) * DK + rk[:, None]) * DV + rv[None, :]
    s = tl.load(s_ptrs, mask=v_ok[None, :], other=0.0)  # [DK, BLOCK_V]
    s = tl.where(resume, s, 0.0)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    decay = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
    pdl_wait(USE_PDL)
    row = y_ptr + n * C
    q = tl.load(row + hk * DK + rk).to(tl.float32)
    k = tl.load(row + key_dim // 2 + hk * DK + rk).to(tl.float32)
    v = tl.load(row + key_dim + h * DV + rv, mask=v_ok, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    a = tl.load(a_ptr + n * stride_an + h).to(tl.float32)
    b = tl.load(b_ptr + n * stride_bn + h)
    sp = a + dt_bias
    softplus = tl.where(sp > 20.0, sp, tl.log(1.0 + tl.exp(sp)))  # torch's threshold
    g = decay * softplus
    # sigmoid in b's dtype, as the reference takes it
    beta = (1.0 / (1.0 + tl.exp(-b.to(tl.float32)))).to(b.dtype).to(tl.float32)
    s = s * tl.exp(g)
    kv = tl.sum(s * k[:, None], axis=0)  # [BLOCK_V]
    s = s + k[:, None] * (beta * (v - kv))[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(s_ptrs, s, mask=v_ok[None, :])
    tl.store(out_ptr + (n * HV + h) * DV + rv, o.to(out_ptr.dtype.element_ty), mask=v_ok)


def decode_step(
    mixed: torch.Tensor,  # [N, conv_dim] pre-conv [q | k | v], one token per sequence (rows may be strided)
    conv_weight: torch.Tensor,  # [conv_dim, K]
    conv_states: torch.Tensor,  # [num_slots, conv_dim, K - 1], updated in place
    a: torch.Tensor,  # [N, Hv]
    b: torch.Tensor,  # [N, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [N] int64
    context_lens: torch.Tensor,  # [N] int32
    num_k_heads: int,
) -> torch.Tensor:  # [N, Hv, Dv] in mixed's dtype
    N, C = mixed.shape
    K = conv_weight.shape[1]
    _, HV, DK, DV = states.shape
    if triton.next_power_of_2(DK) != DK:
        raise ValueError(f"the decode kernel takes a power-of-two key head dim, got {DK}")
    # strided views of the projection are read as they are (rows apart, columns contiguous)
    mixed, a, b = (t if t.stride(-1) == 1 else t.contiguous() for t in (mixed, a, b))
    y = torch.empty((N, C), dtype=mixed.dtype, device=mixed.device)
    out = torch.empty((N, HV, DV), dtype=mixed.dtype, device=mixed.device)
    if N == 0:
        return out
    block_c = 128
    use_pdl = pdl_enabled(mixed.device)
    _conv_step_kernel[(N, triton.cdiv(C, block_c))](
        mixed, conv_weight.contiguous(), conv_states, slots, context_lens, y, C, mixed.stride(0), K=K,
        BLOCK_C=block_c, BLOCK_K=triton.next_power_of_2(K), USE_PDL=use_pdl, **pdl_launch(use_pdl),
    )
    block_v = min(64, triton.next_power_of_2(DV))
    _delta_step_kernel[(N, HV, triton.cdiv(DV, block_v))](
        y, a, b, A_log, dt_bias, states, slots, context_lens, out, C, HV, DV, HV // num_k_heads,
        a.stride(0), b.stride(0), DK=DK, BLOCK_V=block_v, USE_PDL=use_pdl, **pdl_launch(use_pdl),
    )
    return out
