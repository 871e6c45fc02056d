"""GPTQ: each linear's columns are rounded to int4 one at a time, and the rounding error of each
is compensated in the columns not yet rounded, weighted by the inverse Hessian of the layer's
squared output error, H = 2 X^T X / n over the calibration inputs X (Frantar et al., 2022). Work
goes in blocks of 128 columns with lazy updates of the rest; the inverse Hessian is taken through
its Cholesky factor after adding damp_percent of its mean diagonal. Group scales and zero points
are fixed when the group's first column comes up (from the already-updated weights). With
desc_act, columns go in order of decreasing Hessian diagonal (the most active inputs first), and
g_idx records each input's group in that order.

Within a decoder layer the linears go in the order they run (q/k/v, o, gate/up, down: "true
sequential"), each group's inputs taken with the earlier groups already quantized."""

from __future__ import annotations

import torch

from hotpath.quantizer.int4_rtn import MAX_Q, group_params, quantize_with

BLOCK = 128
SEQUENTIAL_GROUPS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                     ("self_attn.o_proj",), ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


class Hessian:
    """Accumulates H = 2 X^T X / n over the calibration rows of one input."""

    def __init__(self) -> None:
        self.h: torch.Tensor | None = None
        self.n = 0

    def add(self, x: torch.Tensor) -> None:  # [T, K]
        x = x.double()
        t = x.shape[0]
        if self.h is None:
            self.h = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
        self.h.mul_(self.n / (self.n + t)).add_(x.T @ x, alpha=2.0 / (self.n + t))
        self.n += t


def _sym_params(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric groups: zero point 8, scale from the largest magnitude (GPTQ's sym=True)."""
    wmax = torch.maximum(g.amax(-1, keepdim=True).abs(), g.amin(-1, keepdim=True).abs()).clamp(min=1e-5)
    scale = (2 * wmax / MAX_Q).to(torch.float16).float()
    return scale, torch.full_like(scale, (MAX_Q + 1) / 2)


@torch.no_grad()
def gptq_quantize(
    weight: torch.Tensor,  # [N, K]
    hessian: torch.Tensor,  # [K, K]
    group_size: int,
    desc_act: bool = False,
    sym: bool = True,
    damp_percent: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (q [N, K] int32, zeros [N, K/G] int32, scales [N, K/G] fp32 of fp16 values,
    g_idx [K] int32, the dequantized weight [N, K] fp32)."""
    W = weight.float().clone()
    N, K = W.shape
    H = hessian.float().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = torch.argsort(torch.diag(H), descending=True) if desc_act else torch.arange(K, device=W.device)
    W, H = W[:, perm], H[perm][:, perm]
    H += damp_percent * torch.mean(torch.diag(H)) * torch.eye(K, device=W.device)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    params = _sym_params if sym else group_params
    Q = torch.zeros_like(W)
    scales = torch.zeros(N, K // group_size, device=W.device)
    zeros = torch.zeros_like(scales)
    for b0 in range(0, K, BLOCK):
        b1 = min(b0 + BLOCK, K)
        W1, Hinv1 = W[:, b0:b1].clone(), Hinv[b0:b1, b0:b1]
        Err1 = torch.zeros_like(W1)
        for i in range(b1 - b0):
            col = b0 + i
            if col % group_size == 0:  # the group starting here, from the weights as updated so far
                g = col // group_size
                rest = torch.cat([W1[:, i:], W[:, b1:]], dim=1)[:, :group_size]
                scale, zero = params(rest)
                scales[:, g], zeros[:, g] = scale[:, 0], zero[:, 0]
            g = col // group_size
            w = W1[:, i]
            q = quantize_with(w, scales[:, g], zeros[:, g])
            Q[:, col] = q
            deq = (q - zeros[:, g]) * scales[:, g]
            err = (w - deq) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            Err1[:, i] = err
        W[:, b1:] -= Err1 @ Hinv[b0:b1, b1:]

    g_idx_perm = torch.arange(K, device=W.device) // group_size  # group of position j in the order
    g_idx = torch.empty_like(g_idx_perm)
    g_idx[perm] = g_idx_perm
    inv = torch.argsort(perm)
    Q = Q[:, inv]
    deq = (Q - zeros[:, g_idx]) * scales[:, g_idx]
    return Q.int(), zeros.int(), scales, g_idx.int(), deq
