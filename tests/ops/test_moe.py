"""MoE routing and fused experts: the reference against HF transformers, the Triton kernels (both
fused_moe paths) against the reference, the align step's layout, the tuned-config lookup, and
the kernels compiled for AMD and NVIDIA targets without a GPU.

CPU: the kernels under TRITON_INTERPRET=1 in fp32 at small shapes. GPU (`cuda`): bf16 at
Qwen3-30B-A3B / Qwen3-235B-A22B shapes against an fp32 reference, and CUDA graph replays.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from hotpath.ops import moe
from hotpath.ops.moe import reference, tuning
from hotpath.ops.quant import reference as quant_reference
from compile_children import CompileChildren
from ops_cases import TOL, cuda, rel_err


def hf_route(router_logits, top_k, renormalize):
    """Qwen3MoeTopKRouter's arithmetic on given logits (before its cast to the model dtype)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return weights, ids


def distinct_logits(T, E, dtype, seed=0):
    """Router logits without ties: a permutation of E steps of 1/16 per token (exact in bf16)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g) for _ in range(T)]).float().div(16).sub(4).to(dtype)


def tied_logits(T, E, seed=0):
    """Logits taking 3 values: many exact ties, at the top-k boundary too."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (T, E), generator=g).float()


def lowest_index_topk(probs, top_k):
    """The top_k experts by (probability descending, index ascending), one token at a time."""
    rows = [sorted(range(probs.shape[1]), key=lambda e: (-float(p[e]), e))[:top_k] for p in probs]
    return torch.tensor(rows, dtype=torch.int32)


def moe_inputs(T, E, H, I, top_k, dtype, device, seed=0):
    """x, w13, w2 in `dtype`, and routing from random logits (reference.route, on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H**0.5
    w2 = torch.randn(E, H, I, generator=g) / I**0.5
    weights, ids = reference.route(torch.randn(T, E, generator=g), top_k, renormalize=True)
    return (x.to(device, dtype), w13.to(device, dtype), w2.to(device, dtype), weights.to(device),
            ids.to(device))


def fp32_reference(x, w13, w2, weights, ids):
    """The reference in fp32 on the same (rounded) inputs: what the kernels approximate."""
    return reference.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)


# ---- the reference against HF transformers ---------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("E,top_k", [(5, 2), (60, 4), (128, 8)])
def test_route_reference_is_hf_formula(E, top_k, renormalize, dtype):
    logits = distinct_logits(9, E, dtype)
    weights, ids = reference.route(logits, top_k, renormalize)
    want_w, want_ids = hf_route(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids, want_ids.to(torch.int32))
    assert torch.equal(weights, want_w)
    if renormalize:
        assert torch.allclose(weights.sum(-1), torch.ones(9))


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("E,top_k", [(5, 3), (8, 4), (128, 8)])
def test_route_reference_ties_go_to_lower_index(E, top_k, renormalize):
    """Among equal probabilities the lower expert comes first and enters the top k first (HF's
    torch.topk does not promise either; the tie-free test above pins the rest to it)."""
    logits = tied_logits(20, E)
    weights, ids = reference.route(logits, top_k, renormalize)
    probs = torch.softmax(logits, dim=-1)
    assert torch.equal(ids, lowest_index_topk(probs, top_k))
    want = probs.gather(1, ids.long())
    if renormalize:
        want = want / want.sum(-1, keepdim=True)
    assert torch.equal(weights, want)


qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")


@pytest.mark.skipif(not hasattr(qwen3_moe, "Qwen3MoeExperts"),
                    reason="transformers before 5 keeps the experts as separate modules")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k,renormalize", [(2, True), (4, False), (4, True)])
def test_reference_is_hf_sparse_moe_block(top_k, renormalize, dtype):
    """route + fused_moe give Qwen3MoeSparseMoeBlock's output, with the experts path that
    from_pretrained / from_config pick by default (grouped_mm): routing bit for bit, the output bit
    for bit in bf16; in fp32 to rounding, as grouped_mm's GEMMs may sum in another order than one
    matmul an expert on some CPUs (1.7e-6 apart at top-2 on an AMD EPYC, equal on others)."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=48, num_experts=8,
                            num_experts_per_tok=top_k, norm_topk_prob=renormalize)
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    block = qwen3_moe.Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
    block = block.to(dtype)
    x = torch.randn(1, 40, 64).to(dtype)
    with torch.no_grad():
        want = block(x)[0]
        weights, ids = reference.route(torch.nn.functional.linear(x[0], block.gate.weight), top_k,
                                       renormalize)
        _, hf_weights, hf_ids = block.gate(x[0])
        got = reference.fused_moe(x[0], block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
    assert torch.equal(ids, hf_ids) and torch.equal(weights.to(hf_weights.dtype), hf_weights)
    assert got.dtype == dtype
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- CPU: the kernels under TRITON_INTERPRET=1 ------------------------------------------------

@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("T,E,top_k", [(1, 5, 2), (7, 5, 5), (9, 60, 4), (5, 128, 8), (3, 512, 10)])
def test_interpreter_route(T, E, top_k, renormalize, logits_dtype, interpreter, poisoned):
    from hotpath.ops.moe import triton_route

    g = torch.Generator().manual_seed(T + E)
    logits = (torch.randn(T, E, generator=g) * 2).to(logits_dtype)
    weights, ids = triton_route.route(logits, top_k, renormalize)
    want_w, want_ids = reference.route(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("renormalize", [False, True])
def test_interpreter_route_ties(renormalize, interpreter, poisoned):
    from hotpath.ops.moe import triton_route

    logits = tied_logits(30, 12, seed=3)
    weights, ids = triton_route.route(logits, 5, renormalize)
    want_w, want_ids = reference.route(logits, 5, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=1e-7)


def small_configs(T):
    """Tiles smaller than the small shapes (several N tiles, K walked in steps, K = I = 48 not a
    multiple of the K tile; for the grouped path a different BLOCK_M per projection)."""
    from hotpath.ops.moe.tuning import DecodeConfig, GroupedConfig

    rows = 8 if T == 1 else 16
    decode = (DecodeConfig(rows, 32, 4, 1), DecodeConfig(rows, 32, 4, 1))
    grouped = (GroupedConfig(16, 32, 32, 2, 4, 2), GroupedConfig(32, 32, 32, 1, 4, 2))
    return decode, grouped


@pytest.mark.parametrize("tiles", ["default", "small"])
@pytest.mark.parametrize("T", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("E,top_k", [(5, 2), (5, 3)])
def test_interpreter_fused_moe(E, top_k, T, tiles, interpreter, poisoned):
    """Both paths against the fp32 reference (the decode path up to its 16 tokens): with 5
    experts, tokens share experts (the decode kernels read each once for all its tokens)."""
    from hotpath.ops.moe import triton_decode, triton_grouped

    x, w13, w2, weights, ids = moe_inputs(T, E, 64, 48, top_k, torch.float32, "cpu", seed=T)
    want = fp32_reference(x, w13, w2, weights, ids)
    (decode_gu, decode_down), (grouped_gu, grouped_down) = small_configs(T)
    if tiles == "default":
        decode_gu = decode_down = grouped_gu = grouped_down = None
    paths = [triton_grouped.fused_moe(x, w13, w2, weights, ids, grouped_gu, grouped_down)]
    if T <= triton_decode.MAX_TOKENS:
        paths.append(triton_decode.fused_moe(x, w13, w2, weights, ids, decode_gu, decode_down))
    for out in paths:
        assert out.shape == x.shape and out.dtype == x.dtype
        assert rel_err(out, want) < TOL[torch.float32]


@pytest.mark.parametrize("T", [1, 3, 40])
def test_interpreter_expert_map(T, interpreter, poisoned):
    """Expert parallelism: 7 experts, this rank holding experts 2..4 (w13 / w2 their slices).
    The Triton path (the grouped GEMM at every token count, other ranks' pairs aligned into a
    bucket no tile computes) and the reference both sum only the local experts' terms: together
    with the other ranks' parts the sum is the one-rank output."""
    E, top_k = 7, 3
    x, w13, w2, weights, ids = moe_inputs(T, E, 64, 48, top_k, torch.float32, "cpu", seed=T)
    want = reference.fused_moe(x, w13, w2, weights, ids)
    total = torch.zeros_like(want)
    for start, end in ((0, 2), (2, 5), (5, 7)):
        expert_map = torch.full((E,), -1, dtype=torch.int32)
        expert_map[start:end] = torch.arange(end - start, dtype=torch.int32)
        local = (w13[start:end].contiguous(), w2[start:end].contiguous())
        got = moe.fused_moe(x, *local, weights, ids, expert_map=expert_map)
        ref = reference.fused_moe(x, *local, weights, ids, expert_map=expert_map)
        assert rel_err(got, ref) < TOL[torch.float32]
        total += got
    assert rel_err(total, want) < TOL[torch.float32]


def test_interpreter_decode_unused_experts_and_counters(interpreter, poisoned):
    """One token routed to 2 of 8 experts (programs of the other experts never run), then 16
    tokens: the output is right and the down kernel's counters are all back to zero."""
    from hotpath.ops.moe import triton_decode
    from hotpath.ops.triton_utils import zeroed_counters

    for T in (1, 16):
        x, w13, w2, weights, ids = moe_inputs(T, 8, 64, 48, 2, torch.float32, "cpu", seed=5)
        out = triton_decode.fused_moe(x, w13, w2, weights, ids)
        assert rel_err(out, fp32_reference(x, w13, w2, weights, ids)) < TOL[torch.float32]
        counters = zeroed_counters("moe decode down", triton_decode.MAX_COUNTERS, x.device)
        assert not counters.any()


@pytest.mark.parametrize("T", [1, 16, 17])
def test_interpreter_dispatch(T, interpreter, poisoned):
    """The public functions on the Triton side (the decode path up to FEW_TOKENS tokens, the
    grouped one past it) agree with the reference."""
    x, w13, w2, _, _ = moe_inputs(T, 5, 64, 48, 2, torch.float32, "cpu", seed=2)
    logits = torch.randn(T, 5, generator=torch.Generator().manual_seed(1))
    weights, ids = moe.route(logits, 2, renormalize=False)
    want_w, want_ids = reference.route(logits, 2, renormalize=False)
    assert torch.equal(ids, want_ids)
    out = moe.fused_moe(x, w13, w2, weights, ids)
    assert rel_err(out, fp32_reference(x, w13, w2, want_w, want_ids)) < TOL[torch.float32]


@pytest.mark.parametrize("E,top_k", [(5, 2), (7, 3), (16, 8)])
def test_interpreter_one_token_down(E, top_k, interpreter, poisoned):
    """One token's down kernel (all k experts in one program) with tiles that split N and walk K
    in two steps, the second masked, and with the default tiles: against the reference."""
    from hotpath.ops.moe import triton_decode
    from hotpath.ops.moe.tuning import DecodeConfig

    x, w13, w2, weights, ids = moe_inputs(1, E, 64, 48, top_k, torch.float32, "cpu", seed=E)
    want = fp32_reference(x, w13, w2, weights, ids)
    small = DecodeConfig(4, 32, 4, 1)
    h = triton_decode.gate_up(x, w13, ids.view(-1), top_k, small)
    out = triton_decode.down(h, w2, ids.view(-1), weights.view(-1), top_k, small)
    assert rel_err(out, want) < TOL[torch.float32]
    out = triton_decode.fused_moe(x, w13, w2, weights, ids)
    assert rel_err(out, want) < TOL[torch.float32]


# ---- fp8 experts ---------------------------------------------------------------------------------

FP8 = torch.float8_e4m3fn
# per channel; blocks whose rows divide I = 48 (16) and do not (32: a partial last block row in
# the gate and in the up half), whose columns split H = 64 and I = 48 (the last one partial)
FP8_BLOCKS = [None, (16, 32), (32, 16)]


def fp8_moe_inputs(T, E, H, I, top_k, block, dtype, device, seed=0, fp8=FP8):
    """x in `dtype`, fp8 w13 / w2 (values over e4m3's range) with fp32 scales per channel or
    per block in the kernels' layout, and routing from random logits."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 100).clamp(-448, 448).to(FP8)
    w2 = (torch.randn(E, H, I, generator=g) * 100).clamp(-448, 448).to(FP8)
    if block is None:
        s13, s2 = torch.rand(E, 2 * I, generator=g), torch.rand(E, H, generator=g)
    else:
        bn, bk = block
        s13 = torch.rand(E, 2 * -(-I // bn), -(-H // bk), generator=g)
        s2 = torch.rand(E, -(-H // bn), -(-I // bk), generator=g)
    s13, s2 = (s13 + 0.5) / (100 * H**0.5), (s2 + 0.5) / (100 * I**0.5)
    if fp8 == torch.float8_e4m3fnuz:
        w13, s13 = quant_reference.fp8_e4m3fn_to_fnuz(w13, s13)
        w2, s2 = quant_reference.fp8_e4m3fn_to_fnuz(w2, s2)
    weights, ids = reference.route(torch.randn(T, E, generator=g), top_k, renormalize=True)
    return (x, w13.to(device), w2.to(device), weights.to(device), ids.to(device),
            dict(w13_scale=s13.to(device), w2_scale=s2.to(device), block_size=block))


def fp8_reference(x, w13, w2, weights, ids, scales):
    """The reference on fp32 x: what the kernels approximate."""
    return reference.fused_moe(x.float(), w13, w2, weights, ids, **scales)


@pytest.mark.parametrize("block", FP8_BLOCKS)
def test_reference_fp8_is_the_dequantized_experts(block):
    """fp8 experts run as their dequantized fp32 weights would; w13's gate and up halves each
    dequantize with their own block rows, as the checkpoint's separate projections do."""
    x, w13, w2, weights, ids, scales = fp8_moe_inputs(7, 5, 64, 48, 2, block, torch.float32, "cpu")
    s13, s2 = scales["w13_scale"], scales["w2_scale"]
    deq13 = torch.stack([reference.dequantize_experts(w13[e], s13[e], block, 2) for e in range(5)])
    deq2 = torch.stack([reference.dequantize_experts(w2[e], s2[e], block, 1) for e in range(5)])
    for e in range(5):
        for half in range(2):
            rows = slice(half * 48, (half + 1) * 48)
            scale = s13[e, rows] if block is None else s13[e].chunk(2)[half]
            assert torch.equal(deq13[e, rows], quant_reference.dequantize_fp8(w13[e, rows], scale, block))
    got = reference.fused_moe(x, w13, w2, weights, ids, **scales)
    assert torch.equal(got, reference.fused_moe(x, deq13, deq2, weights, ids))


@pytest.mark.parametrize("tiles", ["default", "small"])
@pytest.mark.parametrize("T", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("block", FP8_BLOCKS)
def test_interpreter_fused_moe_fp8(block, T, tiles, interpreter, poisoned):
    """Both paths on fp8 experts against the reference: the block scales per segment (decode at
    one token, tiles wider than a block) or per dot tile (held to one block), the channel scales
    after the sums."""
    from hotpath.ops.moe import triton_decode, triton_grouped

    x, w13, w2, weights, ids, scales = fp8_moe_inputs(T, 5, 64, 48, 3, block, torch.float32, "cpu", seed=T)
    want = fp8_reference(x, w13, w2, weights, ids, scales)
    (decode_gu, decode_down), (grouped_gu, grouped_down) = small_configs(T)
    if tiles == "default":
        decode_gu = decode_down = grouped_gu = grouped_down = None
    paths = [triton_grouped.fused_moe(x, w13, w2, weights, ids, grouped_gu, grouped_down, **scales)]
    if T <= triton_decode.MAX_TOKENS:
        paths.append(triton_decode.fused_moe(x, w13, w2, weights, ids, decode_gu, decode_down, **scales))
    for out in paths:
        assert out.shape == x.shape and out.dtype == x.dtype
        assert rel_err(out, want) < TOL[torch.float32]


@pytest.mark.parametrize("block", FP8_BLOCKS)
def test_interpreter_fp8_one_token_down_and_fnuz(block, interpreter, poisoned):
    """One token's down kernel over tiles wider than a scale block (several segments a tile) and
    narrower ones; e4m3fnuz experts (gfx942's, scales doubled) through both paths."""
    from hotpath.ops.moe import triton_decode, triton_grouped
    from hotpath.ops.moe.triton_common import expert_formats
    from hotpath.ops.moe.tuning import DecodeConfig

    x, w13, w2, weights, ids, scales = fp8_moe_inputs(1, 7, 64, 48, 3, block, torch.float32, "cpu", seed=4)
    want = fp8_reference(x, w13, w2, weights, ids, scales)
    fmt13, fmt2 = expert_formats(w13, *scales.values())
    for block_k in (16, 64):
        cfg = DecodeConfig(4, block_k, 4, 1)
        h = triton_decode.gate_up(x, w13, ids.view(-1), 3, cfg, fmt13)
        out = triton_decode.down(h, w2, ids.view(-1), weights.view(-1), 3, cfg, fmt2)
        assert rel_err(out, want) < TOL[torch.float32]
    for T in (1, 5, 17):
        x, w13, w2, weights, ids, scales = fp8_moe_inputs(T, 5, 64, 48, 2, block, torch.float32, "cpu",
                                                          seed=T, fp8=torch.float8_e4m3fnuz)
        assert w13.dtype == torch.float8_e4m3fnuz
        want = fp8_reference(x, w13, w2, weights, ids, scales)
        for path in (triton_decode, triton_grouped) if T <= 16 else (triton_grouped,):
            assert rel_err(path.fused_moe(x, w13, w2, weights, ids, **scales), want) < TOL[torch.float32]


@pytest.mark.parametrize("T", [1, 16, 17])
def test_interpreter_dispatch_fp8(T, interpreter, poisoned):
    x, w13, w2, weights, ids, scales = fp8_moe_inputs(T, 5, 64, 48, 2, (16, 32), torch.float32, "cpu")
    out = moe.fused_moe(x, w13, w2, weights, ids, **scales)
    assert rel_err(out, fp8_reference(x, w13, w2, weights, ids, scales)) < TOL[torch.float32]


def test_fp8_input_errors():
    x, w13, w2, weights, ids, scales = fp8_moe_inputs(3, 5, 64, 48, 2, (16, 32), torch.float32, "cpu")
    with pytest.raises(ValueError, match="need w13_scale and w2_scale"):
        reference.fused_moe(x, w13, w2, weights, ids)
    with pytest.raises(ValueError, match=r"w13_scale in 16x32 blocks must be fp32 \[5, 6, 2\]"):
        reference.fused_moe(x, w13, w2, weights, ids, scales["w13_scale"][:, :5], scales["w2_scale"], (16, 32))
    with pytest.raises(ValueError, match=r"w2_scale per channel must be fp32 \[5, 64\]"):
        reference.fused_moe(x, w13, w2, weights, ids, torch.ones(5, 96), scales["w2_scale"], None)
    with pytest.raises(ValueError, match="share an fp8 dtype"):
        reference.fused_moe(x, w13, w2.float(), weights, ids, **scales)
    with pytest.raises(ValueError, match="scales are for fp8 experts"):
        reference.fused_moe(x, w13.float(), w2.float(), weights, ids, **scales)
    pytest.importorskip("triton")
    from hotpath.ops.moe import triton_grouped

    with pytest.raises(ValueError, match="power of 2"):
        s13 = torch.ones(5, 2 * 2, 2)
        s2 = torch.ones(5, 3, 2)
        triton_grouped.fused_moe(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2, block_size=(24, 32))


@pytest.mark.parametrize("T,top_k,E,block_m", [(1, 2, 5, 16), (3, 3, 5, 16), (40, 3, 5, 16),
                                                (40, 2, 7, 32), (700, 4, 64, 16)])
def test_interpreter_align_layout(T, top_k, E, block_m, interpreter):
    """Every (token, k) pair in exactly one row of its expert's span, spans padded to block_m
    with the sentinel T * k, each tile of one expert, and nothing allocated but the bound."""
    from hotpath.ops.moe import triton_grouped
    from hotpath.ops.triton_utils import zeroed_counters

    g = torch.Generator().manual_seed(T)
    # skewed routing: some experts take many pairs, the last one none
    popularity = torch.rand(E, generator=g) ** 3
    popularity[-1] = 0
    ids = torch.multinomial(popularity.expand(T, E), top_k, generator=g).to(torch.int32)
    sorted_pairs, block_expert, num_padded = triton_grouped.align_by_expert(ids, E, block_m)
    P = T * top_k
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    padded = (counts + block_m - 1) // block_m * block_m
    assert int(num_padded) == int(padded.sum()) <= sorted_pairs.numel()
    assert block_expert.numel() * block_m == sorted_pairs.numel()
    assert block_expert.numel() == triton_grouped.max_tiles(P, E, block_m)
    used = sorted_pairs[: int(num_padded)].long()
    real = used[used < P]
    assert torch.equal(real.sort().values, torch.arange(P))  # each pair exactly once
    assert torch.equal(used[used >= P], torch.full_like(used[used >= P], P))  # padding: the sentinel
    assert int((used >= P).sum()) == int((padded - counts).sum())
    tiles = used.view(-1, block_m)
    tile_experts = block_expert[: tiles.shape[0]].long()
    assert torch.equal(tile_experts, tile_experts.sort().values)  # spans in expert order
    flat_ids = torch.cat([ids.flatten().long(), torch.tensor([-1])])  # the sentinel's "expert"
    row_experts = flat_ids[tiles]  # [tiles, block_m]
    assert ((row_experts == tile_experts[:, None]) | (tiles == P)).all()
    assert (block_expert[tiles.shape[0]:] == E).all()  # tiles past the spans
    assert not zeroed_counters("moe align counts", triton_grouped.MAX_EXPERTS, ids.device).any()
    assert not zeroed_counters("moe align arrivals", 1, ids.device).any()


def test_interpreter_align_many_programs(interpreter):
    """More pairs than one program of the align kernels takes: the counts of several programs
    meet in the last one."""
    from hotpath.ops.moe import triton_grouped

    T, top_k, E = 900, 3, 6
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    assert T * top_k > 2 * triton_grouped.ALIGN_BLOCK
    sorted_pairs, _, num_padded = triton_grouped.align_by_expert(ids, E, 16)
    used = sorted_pairs[: int(num_padded)]
    assert torch.equal(used[used < T * top_k].sort().values, torch.arange(T * top_k, dtype=torch.int32))


def test_kernel_input_errors():
    from hotpath.ops.moe import triton_decode, triton_grouped

    x, w13, w2, weights, ids = moe_inputs(17, 5, 64, 48, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="at most 16 tokens"):
        triton_decode.fused_moe(x, w13, w2, weights, ids)
    with pytest.raises(ValueError, match="w2 must be"):
        reference.fused_moe(x, w13, w2[:, :, :40], weights, ids)
    with pytest.raises(ValueError, match="share a dtype"):
        triton_grouped.fused_moe(x, w13.double(), w2.double(), weights, ids)
    with pytest.raises(ValueError, match="top_k must be in 1..5"):
        reference.route(torch.randn(3, 5), 6, False)


# ---- tuned configurations ----------------------------------------------------------------------

def test_tuned_config_lookup(tmp_path):
    """The nearest tuned token count of the path's section; the default rule without a file."""
    cpu = torch.device("cpu")
    name = tuning.config_file(128, 1536, 2048, torch.bfloat16, "cpu")
    assert name == "E=128,N=1536,K=2048,device=cpu,dtype=bfloat16.json"
    grouped = {str(t): dict(block_m=16 if t < 256 else 64, block_n=64, block_k=64, group_m=t % 7,
                            num_warps=4, num_stages=3) for t in (32, 64, 256, 4096)}
    decode = {"1": dict(block_n=8, block_k=1024, num_warps=4, num_stages=1),
              "8": dict(block_n=32, block_k=128, num_warps=4, num_stages=4)}
    (tmp_path / name).write_text(json.dumps({"grouped": grouped, "decode": decode}))
    lookup = dict(top_k=8, E=128, N=1536, K=2048, dtype=torch.bfloat16, device=cpu, config_dir=tmp_path)
    assert tuning.grouped_config(T=40, **lookup).group_m == 32 % 7
    assert tuning.grouped_config(T=200, **lookup).group_m == 256 % 7
    assert tuning.grouped_config(T=100000, **lookup).group_m == 4096 % 7
    del lookup["top_k"]
    assert tuning.decode_config(T=1, **lookup) == tuning.DecodeConfig(8, 1024, 4, 1)
    assert tuning.decode_config(T=5, **lookup) == tuning.DecodeConfig(32, 128, 4, 4)
    # another dtype: no file, the default rules
    lookup["dtype"] = torch.float16
    assert tuning.decode_config(T=1, **lookup) == tuning.default_decode_config(1, 2048)
    assert tuning.grouped_config(T=40, top_k=8, **lookup) == tuning.default_grouped_config(
        40, 8, 128, 1536, 2048, hip=torch.version.hip is not None)


def test_default_configs():
    """M tiles follow the tokens per expert; AMD takes two pipeline stages."""
    assert tuning.default_grouped_config(16, 8, 128, 1536, 2048, hip=False).block_m == 16
    assert tuning.default_grouped_config(4096, 8, 128, 1536, 2048, hip=False).block_m == 64
    assert tuning.default_grouped_config(4096, 8, 128, 1536, 2048, hip=True).num_stages == 2
    assert tuning.default_decode_config(1, 768) == tuning.DecodeConfig(8, 1024, 4, 1)
    assert tuning.default_decode_config(1, 768, top_k=8) == tuning.DecodeConfig(4, 256, 4, 1)
    assert tuning.default_decode_config(8, 768).block_n >= 16  # a dot's least


# ---- the kernels compiled for AMD and NVIDIA targets, without a GPU ----------------------------

# Qwen3-30B-A3B's experts (bf16 weights 805 MB and 403 MB: AMD's buffer loads) and
# Qwen3-235B-A22B's (3.2 GB and 1.6 GB: plain loads over 2 GB)
COMPILE_SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "qwen3-235b-a22b": (128, 4096, 1536, 8)}
COMPILE_TOKENS = (1, 8, 512)  # decode at one row and with tensor cores; grouped
COMPILE_TARGETS = ("gfx942", "gfx950", "sm90")


def _record_launches(target_name: str) -> list[tuple[str, object, tuple, dict]]:
    """(label, kernel, args, kwargs) of every MoE kernel launch at COMPILE_SHAPES and
    COMPILE_TOKENS on `target_name`, its host code run on meta tensors with the launches recorded
    instead of run; the grouped tiles the default rule gives that target."""
    from triton.backends.compiler import GPUTarget

    from hotpath.ops.moe import triton_decode, triton_grouped, triton_route
    from hotpath.ops.triton_utils import pdl_supported

    target = {"gfx942": GPUTarget("hip", "gfx942", 64), "gfx950": GPUTarget("hip", "gfx950", 64),
              "sm90": GPUTarget("cuda", 90, 32)}[target_name]
    hip = target.backend == "hip"
    launches, label = [], [""]

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((f"{label[0]}/{self.kernel.fn.__name__}",
                                                            self.kernel, args, kwargs))

    # this runs in a child process of its own: the kernels stay replaced
    for module in (triton_route, triton_grouped, triton_decode):
        for name in [name for name in vars(module) if name.endswith("_kernel")]:
            setattr(module, name, Recorder(getattr(module, name)))
        module.pdl_enabled = lambda device: pdl_supported(target)
    meta = torch.device("meta")
    for shape_name, (E, H, I, top_k) in COMPILE_SHAPES.items():
        w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=meta)
        w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device=meta)
        for T in COMPILE_TOKENS:
            label[0] = f"{shape_name}/T{T}"
            x = torch.empty(T, H, dtype=torch.bfloat16, device=meta)
            weights, ids = triton_route.route(torch.empty(T, E, dtype=torch.bfloat16, device=meta), top_k, True)
            if T <= moe.FEW_TOKENS:
                triton_decode.fused_moe(x, w13, w2, weights, ids)
            else:
                configs = [tuning.default_grouped_config(T, top_k, E, N, K, hip) for N, K in ((2 * I, H), (H, I))]
                triton_grouped.fused_moe(x, w13, w2, weights, ids, *configs)
    return launches


def _compile_all(target_name: str) -> dict[str, str]:
    """label -> the binary's kind, or the compile error."""
    from triton.backends.compiler import GPUTarget

    from hotpath.ops.triton_utils import compile_launch

    target = {"gfx942": GPUTarget("hip", "gfx942", 64), "gfx950": GPUTarget("hip", "gfx950", 64),
              "sm90": GPUTarget("cuda", 90, 32)}[target_name]
    results = {}
    for label, kernel, args, kwargs in _record_launches(target_name):
        try:
            asm = compile_launch(kernel, args, kwargs, target).asm
            results[label] = next(k for k in ("hsaco", "cubin") if k in asm)
        except Exception as e:  # reported by the test
            root = e
            while root.__cause__ is not None:
                root = root.__cause__
            results[label] = f"error: {type(e).__name__}: {str(e)[-1500:]} / {type(root).__name__}: {str(root)[-500:]}"
    return results


_children = CompileChildren("hotpath-moe-compile-")  # a child a target, compiling its launches


def start_compiling(items: list[pytest.Item]) -> None:
    """Starts a child process per target (the kernels compiled, not interpreted) running
    _compile_all(target), side by side, at low priority, if `items` hold test_kernels_compile.
    Called when collection ends (tests/ops/conftest.py), so that they compile beside the tests
    before this file's rather than ahead of its first case."""
    if _children.started or not any(getattr(item, "module", None) is sys.modules[__name__]
                                    and item.originalname == "test_kernels_compile" for item in items):
        return
    _children.start({t: ([__file__, t, "--nice"], None) for t in COMPILE_TARGETS},
                    pythonpath=os.path.dirname(__file__))


stop_compiling = _children.stop


@pytest.fixture(scope="module")
def compiled(request) -> dict[str, dict[str, str]]:
    """target -> _compile_all(target), from the children start_compiling started (now, if
    collection did not)."""
    pytest.importorskip("triton")
    start_compiling(request.session.items)
    return _children.results(timeout=1800)  # beside test_cross_compile's children, under pytest-xdist


@pytest.mark.parametrize("target", COMPILE_TARGETS)
def test_kernels_compile(compiled, target):
    """Every kernel of the routing and both fused_moe paths, at the launches the host code makes
    for those shapes on the target (PDL on sm90 only), compiles to the target's binary."""
    results = compiled[target]
    want = "cubin" if target.startswith("sm") else "hsaco"
    errors = {label: r for label, r in results.items() if r != want}
    assert not errors, errors
    kernels = {label.rsplit("/", 1)[1] for label in results}
    assert kernels == {"_route_kernel", "_align_count_kernel", "_align_place_kernel", "_grouped_gemm_kernel",
                       "_decode_gate_up_kernel", "_decode_down_kernel", "_decode_down_one_token_kernel"}


# ---- GPU: bf16 at real shapes, CUDA graphs ------------------------------------------------------

REAL_SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "qwen3-235b-a22b": (128, 4096, 1536, 8)}


@cuda
@pytest.mark.parametrize("T", [1, 2, 8, 16, 17, 64, 512, 4096])
@pytest.mark.parametrize("shape", list(REAL_SHAPES))
def test_cuda_fused_moe_bf16(shape, T, gpu_triton, poisoned):
    """bf16 against the fp32 reference on the same bf16 inputs, within TOL[bf16] (1e-2) relative
    error, through the dispatch (decode kernels up to FEW_TOKENS, grouped GEMM past it)."""
    E, H, I, top_k = REAL_SHAPES[shape]
    x, w13, w2, weights, ids = moe_inputs(T, E, H, I, top_k, torch.bfloat16, "cuda", seed=T)
    out = moe.fused_moe(x, w13, w2, weights, ids)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, fp32_reference(x, w13, w2, weights, ids)) < TOL[torch.bfloat16]
    # and close to the bf16 reference, which rounds where the kernels round
    assert rel_err(out, reference.fused_moe(x, w13, w2, weights, ids)) < 2e-3


@cuda
@pytest.mark.parametrize("T", [1, 8, 40])
def test_cuda_fused_moe_fp32(T, gpu_triton, poisoned):
    """fp32 (the GPU parity tests' dtype): full-precision dots, both paths at fp32 tolerance."""
    from hotpath.ops.moe import triton_decode, triton_grouped

    x, w13, w2, weights, ids = moe_inputs(T, 128, 2048, 768, 8, torch.float32, "cuda", seed=T)
    want = reference.fused_moe(x, w13, w2, weights, ids)
    assert rel_err(triton_grouped.fused_moe(x, w13, w2, weights, ids), want) < TOL[torch.float32]
    if T <= triton_decode.MAX_TOKENS:
        assert rel_err(triton_decode.fused_moe(x, w13, w2, weights, ids), want) < TOL[torch.float32]


@cuda
@pytest.mark.parametrize("E,top_k", [(60, 4), (128, 8), (512, 10)])
def test_cuda_route(E, top_k, gpu_triton, poisoned):
    """The kernel's picks are the reference's where the probabilities are not within an fp32
    rounding of each other; weights to fp32 rounding."""
    from hotpath.ops.moe import triton_route

    logits = distinct_logits(300, E, torch.bfloat16).cuda()
    for renormalize in (False, True):
        weights, ids = triton_route.route(logits, top_k, renormalize)
        want_w, want_ids = reference.route(logits, top_k, renormalize)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=1e-7)


@cuda
def test_cuda_decode_is_reproducible(gpu_triton):
    """The decode path sums each token's terms in a fixed order: bitwise the same every call
    (its counters reset every time)."""
    x, w13, w2, weights, ids = moe_inputs(8, 128, 2048, 768, 8, torch.bfloat16, "cuda")
    want = moe.fused_moe(x, w13, w2, weights, ids)
    for _ in range(100):
        assert torch.equal(moe.fused_moe(x, w13, w2, weights, ids), want)


@cuda
@pytest.mark.parametrize("T", [1, 8, 64])
def test_cuda_route_and_fused_moe_in_graph(T, gpu_triton):
    """route + fused_moe captured in a CUDA graph (no host sync, static shapes), replayed on new
    router logits and hidden states: each replay equals an eager call on them."""
    E, H, I, top_k = REAL_SHAPES["qwen3-30b-a3b"]
    x, w13, w2, _, _ = moe_inputs(T, E, H, I, top_k, torch.bfloat16, "cuda")
    logits = torch.randn(T, E, device="cuda").to(torch.bfloat16)

    def step():
        weights, ids = moe.route(logits, top_k, renormalize=True)
        return moe.fused_moe(x, w13, w2, weights, ids)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm the allocator outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):
        g = torch.Generator("cuda").manual_seed(seed)
        logits.copy_(torch.randn(T, E, generator=g, device="cuda"))
        x.copy_(torch.randn(T, H, generator=g, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = step()
        if T <= moe.FEW_TOKENS:
            assert torch.equal(out, want)
        else:  # the grouped path's atomics sum in a varying order
            assert rel_err(out, want) < 1e-3


@cuda
@pytest.mark.parametrize("T", [1, 8, 16, 64, 300])
@pytest.mark.parametrize("block", [(128, 128), None])
def test_cuda_fused_moe_fp8(block, T, gpu_triton, poisoned):
    """fp8 experts at Qwen3-30B-A3B's shapes (block scales as Qwen3-30B-A3B-FP8 ships them, and
    per channel), bf16 x, through the dispatch (decode kernels for 1..16 tokens, the grouped GEMM
    past): against the fp32 reference, and close to the bf16 one, which rounds where they do."""
    E, H, I, top_k = REAL_SHAPES["qwen3-30b-a3b"]
    x, w13, w2, weights, ids, scales = fp8_moe_inputs(T, E, H, I, top_k, block, torch.bfloat16, "cuda", seed=T)
    out = moe.fused_moe(x, w13, w2, weights, ids, **scales)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, fp8_reference(x, w13, w2, weights, ids, scales)) < TOL[torch.bfloat16]
    assert rel_err(out, reference.fused_moe(x, w13, w2, weights, ids, **scales)) < 2e-3


@cuda
@pytest.mark.parametrize("T", [1, 8, 64])
def test_cuda_fp8_moe_in_graph(T, gpu_triton):
    """route + fused_moe on fp8 block experts captured in a CUDA graph, replayed on new inputs:
    each replay equals an eager call (no host sync, no data-dependent shape on the fp8 path)."""
    E, H, I, top_k = REAL_SHAPES["qwen3-30b-a3b"]
    x, w13, w2, _, _, scales = fp8_moe_inputs(T, E, H, I, top_k, (128, 128), torch.bfloat16, "cuda")
    logits = torch.randn(T, E, device="cuda").to(torch.bfloat16)

    def step():
        weights, ids = moe.route(logits, top_k, renormalize=True)
        return moe.fused_moe(x, w13, w2, weights, ids, **scales)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(3):
        g = torch.Generator("cuda").manual_seed(seed)
        logits.copy_(torch.randn(T, E, generator=g, device="cuda"))
        x.copy_(torch.randn(T, H, generator=g, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = step()
        if T <= moe.FEW_TOKENS:
            assert torch.equal(out, want)
        else:
            assert rel_err(out, want) < 1e-3


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") != "1", "the kernels must be compiled, not interpreted"
    # python tests/ops/test_moe.py TARGET [--nice]: --nice beside the rest of the test session
    if sys.argv[2:] == ["--nice"]:
        os.nice(10)
    print(json.dumps(_compile_all(sys.argv[1])))


def check_add_into_residual(M, H, dtype, device, shared):
    """The sparse block's end in the fused chain: the residual and its sums of squares, against
    the reference, with the shared expert's gate a strided column of the router's logits."""
    g = torch.Generator().manual_seed(M)
    residual = torch.randn(M, H, generator=g).to(device, dtype)
    experts_out = torch.randn(M, H, generator=g).to(device, dtype)
    shared_out = torch.randn(M, H, generator=g).to(device, dtype) if shared else None
    logits = torch.randn(M, 9, generator=g).to(device, dtype)
    gate = logits[:, 8:] if shared else None
    want = residual.clone()
    want_sumsq = reference.add_into_residual(want, experts_out, shared_out, gate)
    got = residual.clone()
    got_sumsq = moe.add_into_residual(got, experts_out, shared_out, gate)
    assert got_sumsq.shape == want_sumsq.shape == (1, M)
    assert (got == want).float().mean() > 0.99  # rounded where the reference rounds
    assert rel_err(got, want) < TOL[dtype]
    assert rel_err(got_sumsq, want_sumsq) < 1e-5
    assert not torch.equal(got, residual)


@pytest.mark.parametrize("shared", [False, True])
def test_interpreter_add_into_residual(shared, interpreter, poisoned):
    check_add_into_residual(3, 100, torch.float32, "cpu", shared)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shared", [False, True])
def test_cuda_add_into_residual(shared, dtype, gpu_triton, poisoned):
    check_add_into_residual(16, 2048, dtype, "cuda", shared)
