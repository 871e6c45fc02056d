"""Gated DeltaNet (the linear-attention layers of Qwen3-Next and Qwen3.5), in torch: the readable
definition the Triton kernels are checked against. It follows the math of HF transformers' torch
fallback (models/qwen3_next), in the engine's flat-token layout.

Per value head a sequence carries a state S [Dk, Dv] (fp32). With q and k L2-normalised and q
scaled by 1 / sqrt(Dk), each token t does

    S <- exp(g_t) * S                          decay (g_t <= 0)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T    delta rule: move S's answer to k_t towards v_t
    o_t = S^T q_t

`recurrent` runs that loop token by token (decode). `chunked` computes the same over chunks of C
tokens with matmuls (prefill): inside a chunk, with c_t the decay accumulated from the chunk's
start to t and D[i, j] = exp(c_i - c_j) for j <= i (else 0),

    A = strictly-lower(beta_i k_i.k_j D[i, j])        the tokens' updates interacting
    (I + A) U = beta * V,  (I + A) W = beta * K * exp(c)   (a unit lower-triangular solve)
    V' = U - W S0                                     the corrections the chunk writes
    O  = (Q * exp(c)) S0 + (Q K^T * D) V'             the state read, plus the chunk's own tokens
    S1 = exp(c_last) S0 + (K * exp(c_last - c))^T V'

Both continue from a given state, so a prompt may be prefilled in pieces (chunked prefill, a
prefix-cache hit) and decoding resumes where the prompt left off.

Before the rule, the layer's q, k and v pass through a causal depthwise conv1d (kernel 4, SiLU)
whose last K - 1 inputs are the other per-sequence state (`causal_conv1d`); the gates come from
the layer's projections (`gates`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) along the last axis (the FLA library's and HF's form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gates(
    a: torch.Tensor,  # [T, Hv], the layer's a projection
    b: torch.Tensor,  # [T, Hv], the layer's b projection
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
) -> tuple[torch.Tensor, torch.Tensor]:  # g [T, Hv] fp32 (log decay, <= 0), beta [T, Hv]
    """g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b) in b's dtype."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()


def _prepare(q, k, v, g, beta):
    """fp32 [H, T, D] tensors, q and k L2-normalised and repeated to the value heads, q scaled."""
    num_k_heads, num_v_heads = k.shape[1], v.shape[1]
    if num_v_heads % num_k_heads:
        raise ValueError(f"{num_v_heads} value heads do not share {num_k_heads} key heads evenly")
    q, k = l2norm(q.float()), l2norm(k.float())
    if num_v_heads != num_k_heads:  # each key head serves consecutive value heads
        q = q.repeat_interleave(num_v_heads // num_k_heads, dim=1)
        k = k.repeat_interleave(num_v_heads // num_k_heads, dim=1)
    q = q * q.shape[-1] ** -0.5
    return (q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1),
            g.float().transpose(0, 1), beta.float().transpose(0, 1))


def recurrent(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] log decay
    beta: torch.Tensor,  # [T, Hv]
    state: torch.Tensor,  # [Hv, Dk, Dv] fp32, the state before the first token
) -> tuple[torch.Tensor, torch.Tensor]:  # o [T, Hv, Dv] in v's dtype, the state after the last
    """The gated delta rule one token at a time: its definition."""
    q, k, vf, g, beta = _prepare(q, k, v, g, beta)
    s = state.float().clone()
    out = torch.empty_like(vf)  # [Hv, T, Dv]
    for t in range(vf.shape[1]):
        s = s * g[:, t].exp()[:, None, None]
        kv = torch.einsum("hkv,hk->hv", s, k[:, t])  # what the state answers to k_t
        s = s + k[:, t, :, None] * (beta[:, t, None] * (vf[:, t] - kv))[:, None, :]
        out[:, t] = torch.einsum("hkv,hk->hv", s, q[:, t])
    return out.transpose(0, 1).to(v.dtype), s


def chunked(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] log decay
    beta: torch.Tensor,  # [T, Hv]
    state: torch.Tensor,  # [Hv, Dk, Dv] fp32, the state before the first token
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:  # o [T, Hv, Dv] in v's dtype, the state after the last
    """The same as `recurrent`, a chunk of tokens at a time (see the module docstring)."""
    q, k, vf, g, beta = _prepare(q, k, v, g, beta)
    T = vf.shape[1]
    s = state.float().clone()
    out = torch.empty_like(vf)  # [Hv, T, Dv]
    for start in range(0, T, chunk_size):
        sl = slice(start, min(start + chunk_size, T))
        qc, kc, vc, bc = q[:, sl], k[:, sl], vf[:, sl], beta[:, sl]  # [Hv, C, D], [Hv, C]
        c = g[:, sl].cumsum(-1)  # [Hv, C] decay from the chunk's start
        n = c.shape[1]
        lower = torch.ones(n, n, dtype=torch.bool, device=c.device).tril()
        decay = torch.where(lower, (c[:, :, None] - c[:, None, :]).clamp(max=0).exp(), 0.0)  # [Hv, C, C]
        a = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * decay).tril(-1)
        eye = torch.eye(n, device=c.device)
        u = torch.linalg.solve_triangular(eye + a, bc[..., None] * vc, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(eye + a, (bc * c.exp())[..., None] * kc, upper=False,
                                          unitriangular=True)
        v_new = u - w @ s  # [Hv, C, Dv]
        out[:, sl] = (qc * c.exp()[..., None]) @ s + ((qc @ kc.transpose(1, 2)) * decay) @ v_new
        last = c[:, -1:]  # [Hv, 1]
        s = last.exp()[..., None] * s + (kc * (last - c).exp()[..., None]).transpose(1, 2) @ v_new
    return out.transpose(0, 1).to(v.dtype), s


def gated_delta_rule(
    q: torch.Tensor,  # [num_tokens, Hk, Dk], the tokens of several sequences, one after another
    k: torch.Tensor,  # [num_tokens, Hk, Dk]
    v: torch.Tensor,  # [num_tokens, Hv, Dv]
    g: torch.Tensor,  # [num_tokens, Hv]
    beta: torch.Tensor,  # [num_tokens, Hv]
    cu_seqlens: list[int],  # sequence i's tokens are cu_seqlens[i]:cu_seqlens[i + 1]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: list[int],  # sequence i's state slot
) -> torch.Tensor:  # [num_tokens, Hv, Dv]
    """Each sequence's tokens from its slot's state (chunked), the state after its last token
    written back to the slot."""
    out = torch.empty_like(v)
    for i, slot in enumerate(slots):
        sl = slice(cu_seqlens[i], cu_seqlens[i + 1])
        out[sl], states[slot] = chunked(q[sl], k[sl], v[sl], g[sl], beta[sl], states[slot])
    return out


def causal_conv1d(
    x: torch.Tensor,  # [T, C], one sequence's new inputs
    weight: torch.Tensor,  # [C, K] depthwise taps
    bias: torch.Tensor | None,  # [C]
    conv_state: torch.Tensor,  # [C, K - 1], the sequence's K - 1 inputs before x (zeros at its start)
) -> tuple[torch.Tensor, torch.Tensor]:  # silu(conv) [T, C] in x's dtype, the new state [C, K - 1]
    """y_t = silu(bias + sum_j weight[:, j] * x_{t - K + 1 + j}), over the state's inputs, then x."""
    width = weight.shape[1]
    if x.shape[0] == 0:  # no inputs: nothing out, the state as it was
        return x.new_empty(x.shape), conv_state.clone()
    full = torch.cat([conv_state.to(weight.dtype), x.to(weight.dtype).T], dim=1)  # [C, K - 1 + T]
    y = F.conv1d(full[None], weight[:, None, :], bias, groups=weight.shape[0])[0]  # [C, T]
    return F.silu(y).T.to(x.dtype), full[:, full.shape[1] - (width - 1):].to(conv_state.dtype)


def decode_step(
    mixed: torch.Tensor,  # [N, conv_dim] pre-conv [q | k | v], one token per sequence
    conv_weight: torch.Tensor,  # [conv_dim, K]
    conv_states: torch.Tensor,  # [num_slots, conv_dim, K - 1], updated in place
    a: torch.Tensor,  # [N, Hv]
    b: torch.Tensor,  # [N, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    states: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32, updated in place
    slots: torch.Tensor,  # [N] int64
    context_lens: torch.Tensor,  # [N] int32; 1: the sequence's first token (zero states)
    num_k_heads: int,
) -> torch.Tensor:  # [N, Hv, Dv] in mixed's dtype
    """One token of each of N sequences through the conv and the recurrence, from and back into
    their slots: the layer's decode step."""
    _, num_v_heads, dk, dv = states.shape
    g, beta = gates(a, b, A_log, dt_bias)
    out = torch.empty((mixed.shape[0], num_v_heads, dv), dtype=mixed.dtype, device=mixed.device)
    for i, (slot, ctx) in enumerate(zip(slots.tolist(), context_lens.tolist())):
        if ctx == 1:
            conv_states[slot].zero_()
            states[slot].zero_()
        y, conv_states[slot] = causal_conv1d(mixed[i:i + 1], conv_weight, None, conv_states[slot])
        q, k, v = y[0].split([num_k_heads * dk, num_k_heads * dk, num_v_heads * dv])
        o, states[slot] = recurrent(q.reshape(1, num_k_heads, dk), k.reshape(1, num_k_heads, dk),
                                    v.reshape(1, num_v_heads, dv), g[i:i + 1], beta[i:i + 1], states[slot])
        out[i] = o[0]
    return out
