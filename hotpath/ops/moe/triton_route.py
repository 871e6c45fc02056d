"""Top-k routing in one launch: a program per token holds the token's E router logits (E up to
MAX_EXPERTS) in registers, takes their softmax in fp32, then picks the k largest probabilities
one at a time (the largest left, the lowest expert index among equals, then masks it out), and
optionally renormalises the k weights by their sum. No host sync and no data-dependent shape, so
it can be captured in a CUDA graph. The reference is reference.route; the probabilities may differ
from torch's softmax in the last bit (exp and the sum's order), which changes the choice only
where two probabilities are that close.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.moe.reference import check_route_args
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait

# a program's logits in registers: 1024 fp32 over 4 warps is 8 a thread
MAX_EXPERTS = 1024


@triton.jit
def _route_kernel(
    logits_ptr,  # [T, E]
    weights_ptr,  # [T, top_k] fp32
    ids_ptr,  # [T, top_k] int32
    E,
    top_k,
    stride_t,
    RENORMALIZE: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    re = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + t * stride_t + re, mask=re < E, other=float("-inf")).to(tl.float32)
    num = tl.exp(logits - tl.max(logits, axis=0))
    # lanes past E at -1, below every probability, so they are never picked
    probs = tl.where(re < E, num / tl.sum(num, axis=0), -1.0)
    rk = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in range(top_k):
        best = tl.max(probs, axis=0)
        expert = tl.min(tl.where(probs == best, re, BLOCK_E), axis=0)
        top_w = tl.where(rk == j, best, top_w)
        top_i = tl.where(rk == j, expert, top_i)
        probs = tl.where(re == expert, -1.0, probs)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)  # lanes past top_k hold 0
    out = t * top_k + rk
    tl.store(weights_ptr + out, top_w, mask=rk < top_k)
    tl.store(ids_ptr + out, top_i, mask=rk < top_k)


def route(
    router_logits: torch.Tensor,  # [T, E]
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # [T, top_k] fp32, [T, top_k] int32
    check_route_args(router_logits, top_k)
    T, E = router_logits.shape
    if E > MAX_EXPERTS:
        raise ValueError(f"the routing kernel takes at most {MAX_EXPERTS} experts, got {E}")
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    weights = torch.empty((T, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((T, top_k), dtype=torch.int32, device=router_logits.device)
    if T > 0:
        use_pdl = pdl_enabled(router_logits.device)
        _route_kernel[(T,)](
            router_logits, weights, ids, E, top_k, router_logits.stride(0),
            RENORMALIZE=renormalize,
            USE_PDL=use_pdl,
            BLOCK_E=triton.next_power_of_2(E),
            BLOCK_K=triton.next_power_of_2(top_k),
            num_warps=4,
            **pdl_launch(use_pdl),
        )
    return weights, ids
