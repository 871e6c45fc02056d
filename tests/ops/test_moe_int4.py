"""Fused MoE on int4 experts (AWQ, GPTQ in plain column order): the reference as the experts'
dequantized weights, both kernel paths against it (CPU: the interpreter, fp32 x, small shapes;
GPU: bf16 / fp16 at Qwen3-30B-A3B's shapes).

The experts are in ops/quant's int4 layout per expert and projection (words [E, N, K / 8],
scales and uint8 zero points [E, N, K / G]), built here from random nibbles with
quant reference's pack_int4_layout.
"""

from __future__ import annotations

import pytest
import torch

from hotpath.ops import moe
from hotpath.ops.moe import reference
from hotpath.ops.quant import reference as quant_reference
from ops_cases import TOL, cuda, rel_err


def int4_experts(E, N, K, G, g, scale_dtype):
    """Random int4 experts [E, N, K]: (words, scales, zeros) in the kernels' layout."""
    Gk = K if G == -1 else G
    q = torch.randint(0, 16, (E, N, K), generator=g)
    zeros = torch.randint(0, 16, (E, N, K // Gk), generator=g).to(torch.uint8)
    # (q - z) spans -15..15: scales that keep each projection's outputs near unit size
    scales = ((torch.rand(E, N, K // Gk, generator=g) + 0.5) / (8 * K**0.5)).to(scale_dtype)
    words = torch.stack([quant_reference.pack_int4_layout(q[e], Gk) for e in range(E)])
    return words, scales, zeros


def int4_moe_inputs(T, E, H, I, top_k, G, dtype, device, seed=0):
    """x in `dtype`, int4 w13 / w2 with scales in `dtype` (the model dtype's, as loaded), and
    routing from random logits: (x, w13, w2, weights, ids, the quantization kwargs)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    w13, s13, z13 = int4_experts(E, 2 * I, H, G, g, dtype)
    w2, s2, z2 = int4_experts(E, H, I, G, g, dtype)
    weights, ids = reference.route(torch.randn(T, E, generator=g), top_k, renormalize=True)
    quant = dict(w13_scale=s13.to(device), w2_scale=s2.to(device), w13_zeros=z13.to(device),
                 w2_zeros=z2.to(device), group_size=G)
    return x, w13.to(device), w2.to(device), weights.to(device), ids.to(device), quant


def int4_reference(x, w13, w2, weights, ids, quant):
    """The reference on fp32 x: what the kernels approximate."""
    return reference.fused_moe(x.float(), w13, w2, weights, ids, **quant)


def dequantized(w, scales, zeros, G):
    K = 8 * w.shape[2]
    return torch.stack([quant_reference.dequantize_stored(w[e], scales[e], zeros[e], G if G != -1 else K)
                        for e in range(w.shape[0])])


# H = 128 and I = 256: the kernels' least input (128, a 16-word run), several runs and tiles
SMALL = dict(E=5, H=128, I=256)


@pytest.mark.parametrize("G", [128, 32, -1])
def test_reference_int4_is_the_dequantized_experts(G):
    """int4 experts run as their dequantized fp32 weights would (ops/quant's dequantization,
    gate and up rows together: groups lie along K)."""
    x, w13, w2, weights, ids, quant = int4_moe_inputs(7, **SMALL, top_k=2, G=G, dtype=torch.float32,
                                                      device="cpu")
    deq13 = dequantized(w13, quant["w13_scale"], quant["w13_zeros"], G)
    deq2 = dequantized(w2, quant["w2_scale"], quant["w2_zeros"], G)
    got = reference.fused_moe(x, w13, w2, weights, ids, **quant)
    assert torch.equal(got, reference.fused_moe(x, deq13, deq2, weights, ids))


def small_configs(T):
    """K tiles narrower than a run (walked in several steps: int4 tiles take 16 words at least),
    several N tiles, a different BLOCK_M per grouped projection."""
    from hotpath.ops.moe.tuning import DecodeConfig, GroupedConfig

    rows = 8 if T == 1 else 16
    decode = (DecodeConfig(rows, 128, 4, 1), DecodeConfig(rows, 32, 4, 1))
    grouped = (GroupedConfig(16, 32, 128, 2, 4, 2), GroupedConfig(32, 32, 64, 1, 4, 2))
    return decode, grouped


# each path (one token, several, the grouped GEMM) and each group kind with both tile sets, but
# not every product of them (the interpreter takes ~8 s a case; CI's budget)
@pytest.mark.parametrize("T,G,tiles", [(1, 128, "default"), (1, 32, "small"), (5, 128, "small"),
                                       (5, -1, "default"), (16, 32, "default"), (20, 128, "default"),
                                       (20, 32, "small")])
def test_interpreter_fused_moe_int4(T, G, tiles, interpreter, poisoned):
    """Both paths on int4 experts against the reference: decode at one token (element-wise sums
    per run) and several (tensor cores), the grouped GEMM; groups of 32 (2 runs a group), 128
    (8) and a projection's whole input (-1: 128 and 256)."""
    from hotpath.ops.moe import triton_decode, triton_grouped

    x, w13, w2, weights, ids, quant = int4_moe_inputs(T, **SMALL, top_k=3, G=G, dtype=torch.float32,
                                                      device="cpu", seed=T)
    want = int4_reference(x, w13, w2, weights, ids, quant)
    (decode_gu, decode_down), (grouped_gu, grouped_down) = small_configs(T)
    if tiles == "default":
        decode_gu = decode_down = grouped_gu = grouped_down = None
    paths = [triton_grouped.fused_moe(x, w13, w2, weights, ids, grouped_gu, grouped_down, **quant)]
    if T <= triton_decode.MAX_TOKENS:
        paths.append(triton_decode.fused_moe(x, w13, w2, weights, ids, decode_gu, decode_down, **quant))
    for out in paths:
        assert out.shape == x.shape and out.dtype == x.dtype
        assert rel_err(out, want) < TOL[torch.float32]


def test_interpreter_int4_one_token_down_and_dispatch(interpreter, poisoned):
    """One token's down kernel (all k experts' rows in one program) over tiles of 4 rows, with
    experts past top_k masked (k = 3 of BLOCK_J = 4); the public dispatch at 1, 16 and 17 tokens."""
    from hotpath.ops.moe import triton_decode
    from hotpath.ops.moe.triton_common import expert_formats
    from hotpath.ops.moe.tuning import DecodeConfig

    x, w13, w2, weights, ids, quant = int4_moe_inputs(1, 7, 128, 128, 3, 64, torch.float32, "cpu", seed=4)
    want = int4_reference(x, w13, w2, weights, ids, quant)
    fmt13, fmt2 = expert_formats(w13, quant["w13_scale"], quant["w2_scale"], None, quant["w13_zeros"],
                                 quant["w2_zeros"], 64)
    cfg = DecodeConfig(4, 128, 4, 1)
    h = triton_decode.gate_up(x, w13, ids.view(-1), 3, cfg, fmt13)
    out = triton_decode.down(h, w2, ids.view(-1), weights.view(-1), 3, cfg, fmt2)
    assert rel_err(out, want) < TOL[torch.float32]
    for T in (1, 16, 17):
        x, w13, w2, weights, ids, quant = int4_moe_inputs(T, 5, 128, 128, 2, 128, torch.float32, "cpu")
        out = moe.fused_moe(x, w13, w2, weights, ids, **quant)
        assert rel_err(out, int4_reference(x, w13, w2, weights, ids, quant)) < TOL[torch.float32]


def test_int4_input_errors():
    x, w13, w2, weights, ids, quant = int4_moe_inputs(3, 5, 128, 128, 2, 32, torch.float32, "cpu")
    with pytest.raises(ValueError, match="need w13_scale, w2_scale, w13_zeros, w2_zeros and group_size"):
        reference.fused_moe(x, w13, w2, weights, ids, quant["w13_scale"], quant["w2_scale"])
    with pytest.raises(ValueError, match=r"w13_zeros must be uint8 \[5, 256, 4\]"):
        reference.fused_moe(x, w13, w2, weights, ids, **(quant | dict(w13_zeros=quant["w13_zeros"].int())))
    with pytest.raises(ValueError, match=r"w2_scale must be a float \[5, 128, 4\]"):
        reference.fused_moe(x, w13, w2, weights, ids, **(quant | dict(w2_scale=quant["w2_scale"][:, :, :2])))
    with pytest.raises(ValueError, match="group_size must be -1 or divide"):
        reference.fused_moe(x, w13, w2, weights, ids, **(quant | dict(group_size=48)))
    with pytest.raises(ValueError, match=r"w2 must be \[5, 128, 16\]"):
        reference.fused_moe(x, w13, w2[:, :, :8], weights, ids, **quant)
    with pytest.raises(ValueError, match="zero points and group_size are for int4 experts"):
        reference.fused_moe(x, torch.randn(5, 256, 128), torch.randn(5, 128, 128), weights, ids, group_size=32)
    pytest.importorskip("triton")
    from hotpath.ops.moe import triton_grouped

    # inputs of 64: the reference runs them, the kernels need runs of 16 words (128 columns)
    x, w13, w2, weights, ids, quant = int4_moe_inputs(3, 5, 64, 128, 2, 32, torch.float32, "cpu")
    reference.fused_moe(x, w13, w2, weights, ids, **quant)
    with pytest.raises(ValueError, match="a multiple of 128 in groups of a power of 2"):
        triton_grouped.fused_moe(x, w13, w2, weights, ids, **quant)


# ---- GPU: Qwen3-30B-A3B's shapes ----------------------------------------------------------------

QWEN3_30B_A3B = dict(E=128, H=2048, I=768, top_k=8)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T", [1, 2, 8, 16, 17, 64, 300, 2048])
def test_cuda_fused_moe_int4(T, dtype, gpu_triton, poisoned):
    """Qwen3-30B-A3B-AWQ / -GPTQ-Int4's experts (groups of 128) through the dispatch (decode
    kernels for 1..16 tokens, the grouped GEMM past): against the fp32 reference, and close to the
    16-bit one, which rounds where they do."""
    x, w13, w2, weights, ids, quant = int4_moe_inputs(T, **QWEN3_30B_A3B, G=128, dtype=dtype, device="cuda",
                                                      seed=T)
    out = moe.fused_moe(x, w13, w2, weights, ids, **quant)
    assert out.dtype == dtype
    assert rel_err(out, int4_reference(x, w13, w2, weights, ids, quant)) < TOL[torch.bfloat16]
    assert rel_err(out, reference.fused_moe(x, w13, w2, weights, ids, **quant)) < 2e-3


@cuda
@pytest.mark.parametrize("T", [1, 8, 64])
def test_cuda_int4_moe_in_graph(T, gpu_triton):
    """route + fused_moe on int4 experts captured in a CUDA graph, replayed on new inputs: each
    replay equals an eager call (no host sync, no data-dependent shape on the int4 path)."""
    E, H, I, top_k = QWEN3_30B_A3B.values()
    x, w13, w2, _, _, quant = int4_moe_inputs(T, E, H, I, top_k, 128, torch.bfloat16, "cuda")
    logits = torch.randn(T, E, device="cuda").to(torch.bfloat16)

    def step():
        weights, ids = moe.route(logits, top_k, renormalize=True)
        return moe.fused_moe(x, w13, w2, weights, ids, **quant)

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
        else:  # the grouped path's atomics sum in a varying order
            assert rel_err(out, want) < 1e-3
