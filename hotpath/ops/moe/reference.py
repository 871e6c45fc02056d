"""Mixture of experts as HF transformers computes it (Qwen2-MoE / Qwen3-MoE sparse blocks).

route: the router's softmax over the experts in fp32, the top k, optionally renormalised so that
the k weights sum to 1 (Qwen3MoeTopKRouter / Qwen2MoeTopKRouter). Ties go to the lower expert
index, in which experts are picked and in their order. HF calls torch.topk, which promises no
order among equal values (on the CPU it picks among exact ties freely, even which experts make the
top k; CUDA's takes the lower indices into the top k): only exact ties differ, which random fp32
router logits do not produce. The weights stay fp32 here; HF casts them to the model dtype in the
router, and fused_moe makes that cast where it multiplies by them.

fused_moe: each token's output is the sum over its k experts of weight * down(silu(gate(x)) *
up(x)). It rounds as transformers' default experts path does (>= 5: "grouped_mm", which
from_pretrained and from_config pick; the kernels round the same way):
  - the gate_up projection's output in the model dtype, silu(gate) rounded to it, then the
    product silu(gate) * up rounded to it (torch's bf16 ops);
  - the down projection's output in the model dtype, times the routing weight cast to the model
    dtype, the product rounded to it: one term per (token, expert);
  - a token's k terms summed in fp32 (torch.sum over k of a bf16 [T, k, H] accumulates in fp32)
    and rounded once to the model dtype.
fp8 experts (w13 / w2 float8 with fp32 scales, as ops/quant lays out one fp8 weight; see
dequantize_experts) are dequantized to fp32 and each projection computed in fp32 from x as it
is, its output rounded to x's dtype where the 16-bit experts' output rounds: the arithmetic of
ops/quant's few-rows path (fp8_linear), which the kernels share on every token count.
int4 experts (AWQ, GPTQ: w13 / w2 int32 words in ops/quant's int4 layout, with scales and uint8
zero points per group) likewise: dequantized to fp32 (ops/quant.reference.dequantize_stored) and
multiplied in fp32, as ops/quant's int4_linear; the kernels multiply the exact integers q - z
in x's dtype and scale each group's sum, the same products summed in another order.
HF's "eager" experts loop (used where no implementation is set, e.g. a Qwen3MoeExperts module
built on its own) instead adds each expert's bf16 term into a bf16 sum with index_add_, in
ascending expert order, rounding after every add; in fp32 the two agree to fp32 rounding.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from hotpath.ops.quant.reference import BlockSize, dequantize_fp8, dequantize_stored

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# int4 experts' words (8 nibbles to an int32)
INT4_DTYPE = torch.int32


def route(
    router_logits: torch.Tensor,  # [T, E], any float dtype
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # [T, top_k] fp32 weights, [T, top_k] int32 expert ids
    check_route_args(router_logits, top_k)
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    # a stable descending sort: equal probabilities keep the lower expert first
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]  # [T, top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2 * I, H]: per expert, gate_proj's rows then up_proj's
    w2: torch.Tensor,  # [E, H, I]: down_proj
    topk_weights: torch.Tensor,  # [T, k] fp32
    topk_ids: torch.Tensor,  # [T, k] int, the k experts of each token (distinct within a row)
    w13_scale: torch.Tensor | None = None,  # fp8 and int4 experts: see check_moe_args
    w2_scale: torch.Tensor | None = None,
    block_size: BlockSize | None = None,  # fp8 block scales' (rows, columns); None: per channel
    w13_zeros: torch.Tensor | None = None,  # int4 experts' zero points
    w2_zeros: torch.Tensor | None = None,
    group_size: int | None = None,  # int4 experts' group (-1: a projection's whole input)
    expert_map: torch.Tensor | None = None,  # [E_global] int32: see local_expert_ids
) -> torch.Tensor:  # [T, H] in x's dtype
    check_moe_args(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_size, w13_zeros,
                   w2_zeros, group_size, expert_map)
    T, H = x.shape
    terms = x.new_zeros(T, topk_ids.shape[1], H)  # [T, k, H]: each routed expert's weighted output
    weights = topk_weights.to(x.dtype)  # as HF's router returns them
    w13_of = partial(_expert_weight, w13, w13_scale, w13_zeros, block_size, group_size, 2)
    w2_of = partial(_expert_weight, w2, w2_scale, w2_zeros, block_size, group_size, 1)
    if expert_map is not None:
        topk_ids = local_expert_ids(topk_ids, expert_map)
    for expert in topk_ids.unique().tolist():
        if expert < 0:  # another rank's expert: its term is that rank's
            continue
        token, slot = torch.where(topk_ids == expert)  # the (token, slot) pairs routed to it
        gate, up = _project(x[token], w13_of(expert)).chunk(2, dim=-1)
        out = _project(F.silu(gate) * up, w2_of(expert))  # [n, H]
        terms[token, slot] = out * weights[token, slot, None]
    return terms.sum(dim=1)


def local_expert_ids(
    topk_ids: torch.Tensor,  # [T, k] global expert ids
    expert_map: torch.Tensor,  # [E_global] int32: this rank's index of each expert, -1 if another rank's
) -> torch.Tensor:  # [T, k] int32, -1 for another rank's expert
    """Expert parallelism: the experts are split across ranks and every rank routes every token
    alike, so each rank computes only the (token, expert) pairs of its own experts; a pair routed
    to another rank's expert adds nothing here (its rank adds it, and the ranks' outputs are
    summed)."""
    return expert_map[topk_ids.long()]


def _expert_weight(w: torch.Tensor, scale: torch.Tensor | None, zeros: torch.Tensor | None,
                   block_size: BlockSize | None, group_size: int | None, parts: int,
                   expert: int) -> torch.Tensor:
    """One expert's [N, K] weight: as stored (16-bit), or dequantized to fp32 (fp8, int4)."""
    if scale is None:
        return w[expert]
    if w.dtype == INT4_DTYPE:
        K = 8 * w.shape[2]
        return dequantize_stored(w[expert], scale[expert], zeros[expert], int4_group(group_size, K))
    return dequantize_experts(w[expert], scale[expert], block_size, parts)


def _project(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a @ w^T, rounded to a's dtype; a dequantized (fp32) weight multiplied in fp32."""
    if w.dtype == a.dtype:
        return F.linear(a, w)
    return F.linear(a.float(), w).to(a.dtype)


def int4_group(group_size: int | None, K: int) -> int:
    """An int4 projection's group over its K inputs (-1: all of them)."""
    return K if group_size == -1 else group_size


def dequantize_experts(
    weight: torch.Tensor,  # [N, K] fp8: one expert's projection(s), `parts` stacked along N
    scale: torch.Tensor,  # [N] fp32 per channel, or [parts * ceil(N / parts / bn), ceil(K / bk)]
    block_size: BlockSize | None,
    parts: int,  # 2 for w13 (gate rows, then up rows), 1 for w2
) -> torch.Tensor:  # [N, K] fp32
    """Each stacked part keeps its own block rows (a part of I rows takes ceil(I / bn) of them,
    the last one partial where bn does not divide I), as the checkpoint's separate projections
    hold them."""
    return torch.cat([dequantize_fp8(w, s, block_size)
                      for w, s in zip(weight.chunk(parts), scale.chunk(parts))])


def check_route_args(router_logits: torch.Tensor, top_k: int) -> None:
    if router_logits.dim() != 2 or not router_logits.is_floating_point():
        raise ValueError(f"router_logits must be a float [T, E] tensor, got {router_logits.dtype} "
                         f"{tuple(router_logits.shape)}")
    if not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k must be in 1..{router_logits.shape[1]} (the experts), got {top_k}")


def check_moe_args(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
                   w2_scale: torch.Tensor | None = None, block_size: BlockSize | None = None,
                   w13_zeros: torch.Tensor | None = None, w2_zeros: torch.Tensor | None = None,
                   group_size: int | None = None, expert_map: torch.Tensor | None = None) -> None:
    """expert_map (expert parallelism: w13 / w2 hold this rank's E experts) is an int32 tensor
    [E_global] of local indices in [0, E) or -1, topk_ids indexing it. 16-bit experts share x's dtype. fp8 experts (both float8, e4m3fn or e4m3fnuz) come with
    fp32 scales: per channel w13_scale [E, 2 * I] and w2_scale [E, H]; per (bn, bk) block
    w13_scale [E, 2 * ceil(I / bn), ceil(H / bk)] (the gate's block rows, then the up's) and
    w2_scale [E, ceil(H / bn), ceil(I / bk)]. int4 experts (both int32, ops/quant's int4 layout
    per expert and projection: w13 [E, 2 * I, H / 8], w2 [E, H, I / 8]) come with float scales
    w13_scale [E, 2 * I, H / G] and w2_scale [E, H, I / G], uint8 zero points w13_zeros and
    w2_zeros of the same shapes, and group_size G (-1: each projection's whole input)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got {tuple(x.shape)}")
    T, H = x.shape
    int4 = w13.dtype == INT4_DTYPE
    pack = 8 if int4 else 1
    if w13.dim() != 3 or w13.shape[2] * pack != H or w13.shape[1] % 2:
        raise ValueError(f"w13 must be [E, 2 * I, {H // pack}], got {tuple(w13.shape)}")
    E, I = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (E, H, I // pack) or I % pack:
        raise ValueError(f"w2 must be [{E}, {H}, {I // pack}] to match w13 {tuple(w13.shape)}, got "
                         f"{tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be an int32 or int64 [{T}, k] tensor, got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be a float {tuple(topk_ids.shape)} tensor like topk_ids, got "
                         f"{topk_weights.dtype} {tuple(topk_weights.shape)}")
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.dtype != torch.int32
                                   or expert_map.numel() < E):
        raise ValueError(f"expert_map must be an int32 [E_global] tensor with E_global >= {E} (the local "
                         f"experts), got {expert_map.dtype} {tuple(expert_map.shape)}")
    if int4:
        _check_int4(E, H, I, w2, w13_scale, w2_scale, w13_zeros, w2_zeros, group_size)
        return
    if w13_zeros is not None or w2_zeros is not None or group_size is not None:
        raise ValueError(f"zero points and group_size are for int4 experts, and these are {w13.dtype}")
    if w13.dtype not in FP8_DTYPES:
        if not x.dtype == w13.dtype == w2.dtype:
            raise ValueError(f"x, w13 and w2 must share a dtype, got {x.dtype}, {w13.dtype}, {w2.dtype}")
        if w13_scale is not None or w2_scale is not None:
            raise ValueError(f"scales are for fp8 experts, and these are {w13.dtype}")
        return
    if w2.dtype != w13.dtype:
        raise ValueError(f"w13 and w2 must share an fp8 dtype, got {w13.dtype} and {w2.dtype}")
    if w13_scale is None or w2_scale is None:
        raise ValueError("fp8 experts need w13_scale and w2_scale")
    if block_size is None:
        expected = ((E, 2 * I), (E, H))
    else:
        bn, bk = block_size
        expected = ((E, 2 * -(-I // bn), -(-H // bk)), (E, -(-H // bn), -(-I // bk)))
    for name, scale, shape in (("w13_scale", w13_scale, expected[0]), ("w2_scale", w2_scale, expected[1])):
        if tuple(scale.shape) != shape or scale.dtype != torch.float32:
            kind = "per channel" if block_size is None else f"in {block_size[0]}x{block_size[1]} blocks"
            raise ValueError(f"{name} {kind} must be fp32 {list(shape)}, got {scale.dtype} "
                             f"{list(scale.shape)}")


def _check_int4(E: int, H: int, I: int, w2: torch.Tensor, w13_scale: torch.Tensor | None,
                w2_scale: torch.Tensor | None, w13_zeros: torch.Tensor | None,
                w2_zeros: torch.Tensor | None, group_size: int | None) -> None:
    if w2.dtype != INT4_DTYPE:
        raise ValueError(f"w13 and w2 must both be int4 words (int32), got w2 {w2.dtype}")
    if any(t is None for t in (w13_scale, w2_scale, w13_zeros, w2_zeros)) or group_size is None:
        raise ValueError("int4 experts need w13_scale, w2_scale, w13_zeros, w2_zeros and group_size")
    if group_size != -1 and (group_size < 1 or H % group_size or I % group_size):
        raise ValueError(f"int4 experts' group_size must be -1 or divide H = {H} and I = {I}, got "
                         f"{group_size}")
    for name, scale, zeros, rows, K in (("w13", w13_scale, w13_zeros, 2 * I, H), ("w2", w2_scale, w2_zeros, H, I)):
        shape = (E, rows, K // int4_group(group_size, K))
        if tuple(scale.shape) != shape or not scale.is_floating_point():
            raise ValueError(f"{name}_scale must be a float {list(shape)}, got {scale.dtype} "
                             f"{list(scale.shape)}")
        if tuple(zeros.shape) != shape or zeros.dtype != torch.uint8:
            raise ValueError(f"{name}_zeros must be uint8 {list(shape)}, got {zeros.dtype} "
                             f"{list(zeros.shape)}")


def add_into_residual(
    residual: torch.Tensor,  # [M, H], the residual stream, updated in place
    experts_out: torch.Tensor,  # [M, H], the routed experts' sum
    shared_out: torch.Tensor | None = None,  # [M, H], the shared expert's output
    shared_gate: torch.Tensor | None = None,  # [M, 1] (a strided column is fine), its gate's logit
) -> torch.Tensor:  # [1, M] fp32
    """residual += experts_out (+ sigmoid(shared_gate) * shared_out), rounded where HF's sparse
    block and its residual add round (each op in the model dtype); returns the new rows' sums of
    squares, the statistic the fused decode chain's next projection normalises with."""
    out = experts_out
    if shared_out is not None:
        out = out + torch.sigmoid(shared_gate) * shared_out
    residual.copy_(residual + out)
    return residual.float().pow(2).sum(-1)[None]
