"""Mixture of experts: top-k routing and the routed experts' gated MLPs, as HF's Qwen2-MoE /
Qwen3-MoE sparse blocks compute them (reference.py), with Triton kernels on the GPU (see
hotpath/ops/backend.py): triton_route.py for the routing, triton_decode.py for a few tokens and
triton_grouped.py for more. All of them run without a host sync, so a CUDA graph can hold them.

    weights, ids = route(router_logits, top_k, renormalize)  # [T, k] fp32, [T, k] int32
    out = fused_moe(x, w13, w2, weights, ids)  # [T, H]

w13 [E, 2 * I, H] stacks each expert's gate_proj rows then its up_proj rows; w2 [E, H, I] its
down_proj. They are in x's dtype, or fp8 with fp32 scales per channel or per 128x128 block
(reference.check_moe_args has the layouts):

    out = fused_moe(x, w13, w2, weights, ids, w13_scale, w2_scale, block_size)

or int4 (AWQ, GPTQ in plain column order: int32 words in ops/quant's int4 layout per expert and
projection, w13 [E, 2 * I, H / 8] and w2 [E, H, I / 8], with scales and uint8 zero points per
group of G inputs, [E, 2 * I, H / G] and [E, H, I / G]):

    out = fused_moe(x, w13, w2, weights, ids, w13_scale, w2_scale, w13_zeros=w13_zeros,
                    w2_zeros=w2_zeros, group_size=G)

Every path reads fp8 and int4 experts as they are stored and dequantizes them in registers, x
staying in its dtype (ops/quant's weight-only arithmetic): the decode kernels apply a block scale
per 128-column segment of their sums and a channel scale per row after them; the grouped GEMM
converts each fp8 weight tile to x's dtype (exact), multiplies its dot by the tile's block
scale, or the channel scale in the epilogue. int4 tiles become the exact integers q - z in x's
dtype (fp32 for the one-token sums), a run of columns per nibble, and each group's scale
multiplies its runs' summed products.
"""

from __future__ import annotations

import torch

from hotpath.ops import backend
from hotpath.ops.moe import reference
from hotpath.ops.quant.reference import BlockSize

# Token counts up to this run the decode kernels (each distinct expert's weights read once, every
# token's row in one 16-row dot tile); more run the grouped GEMM, whose taller tiles reuse each
# weight tile over more tokens. 16 is the most the decode kernels take; where the two meet is to
# be measured (benchmarks/tune_moe.py times both up to 16).
FEW_TOKENS = 16


def route(
    router_logits: torch.Tensor,  # [T, E]
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # [T, top_k] fp32 weights, [T, top_k] int32 expert ids
    """Softmax over the experts in fp32, the top_k largest (ties to the lower expert index),
    renormalised to sum to 1 if asked. The weights stay fp32; fused_moe rounds them to the model
    dtype where it multiplies, as HF's router does before returning them."""
    if backend.use_triton(router_logits):
        from hotpath.ops.moe import triton_route

        return triton_route.route(router_logits, top_k, renormalize)
    return reference.route(router_logits, top_k, renormalize)


def fused_moe(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] fp32
    topk_ids: torch.Tensor,  # [T, k] int32, distinct within a row
    w13_scale: torch.Tensor | None = None,  # fp8 and int4 experts
    w2_scale: torch.Tensor | None = None,
    block_size: BlockSize | None = None,  # fp8 block scales' (rows, columns); None: per channel
    w13_zeros: torch.Tensor | None = None,  # int4 experts only
    w2_zeros: torch.Tensor | None = None,
    group_size: int | None = None,
    expert_map: torch.Tensor | None = None,  # [E_global] int32, expert parallelism only
) -> torch.Tensor:  # [T, H] in x's dtype
    """sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, j],
    rounded as HF's experts path rounds (see reference.py). With `expert_map` (expert
    parallelism: w13 / w2 hold this rank's experts, expert_map[e] the local index of global
    expert e or -1) only the pairs routed to this rank's experts are summed
    (reference.local_expert_ids)."""
    scales = dict(w13_scale=w13_scale, w2_scale=w2_scale, block_size=block_size, w13_zeros=w13_zeros,
                  w2_zeros=w2_zeros, group_size=group_size)
    if expert_map is not None:
        scales["expert_map"] = expert_map
    if backend.use_triton(x):
        # the decode kernels compute every pair (each token's k terms complete its sum): with an
        # expert map the grouped GEMM runs at every token count, its other ranks' pairs in a
        # bucket past the last tile it computes
        if x.shape[0] <= FEW_TOKENS and expert_map is None:
            from hotpath.ops.moe import triton_decode

            return triton_decode.fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)
        from hotpath.ops.moe import triton_grouped

        return triton_grouped.fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)
    return reference.fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)


def add_into_residual(
    residual: torch.Tensor,  # [M, H], updated in place
    experts_out: torch.Tensor,  # [M, H]
    shared_out: torch.Tensor | None = None,  # [M, H]
    shared_gate: torch.Tensor | None = None,  # [M, 1] logit
) -> torch.Tensor:  # [1, M] fp32
    """See reference.add_into_residual: the sparse block's end in the fused decode chain, one
    launch on the GPU."""
    if backend.use_triton(residual):
        from hotpath.ops.moe import triton_residual

        return triton_residual.add_into_residual(residual, experts_out, shared_out, shared_gate)
    return reference.add_into_residual(residual, experts_out, shared_out, shared_gate)


__all__ = ["FEW_TOKENS", "add_into_residual", "fused_moe", "route"]
