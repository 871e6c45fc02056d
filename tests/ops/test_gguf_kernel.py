"""GGUF weights kept quantized (hotpath.ops.gguf): the layout against the `gguf` package's own
dequantization, bit for bit, for every supported type; the Triton kernel against the reference
in the interpreter (fp32, small shapes: the GEMV with its K split and fused forms, the GEMM's M
tiles); on a GPU (tests marked `cuda`) in bf16 at Qwen2.5-0.5B's shapes, in a CUDA graph too."""

import gguf
import numpy as np
import pytest
import torch
from ops_cases import TOL, activations, cuda, norm_inputs, rel_err

from hotpath.ops import gguf as ops_gguf
from hotpath.ops.activation import silu_and_mul
from hotpath.ops.gguf import reference
from hotpath.ops.linear import reference as linear_ref

NAMES = list(reference.FORMATS)


def weight(name: str, N: int, K: int, device="cpu", seed: int = 0) -> reference.GGUFWeight:
    raw = reference.random_blocks(name, N, K, np.random.default_rng(seed))
    return reference.repack(reference.FORMATS[name], torch.from_numpy(raw).to(device), K)


@pytest.mark.parametrize("name,K", [(n, 768) for n in NAMES] + [(n, 160) for n in NAMES
                                                                   if reference.FORMATS[n].block == 32])
def test_layout_dequantizes_as_gguf_does(name, K):
    """Random blocks (random bytes for the K-quants: every field, the packed 6-bit scales too)
    repacked and dequantized equal gguf-py's float32 dequantization exactly (K = 160: the sliced
    codes padded to 256 columns); the layout's bytes a weight are the stored ones (plus the
    K-quants' unpacked scales) where K needs no padding."""
    fmt = reference.FORMATS[name]
    N = 5
    raw = reference.random_blocks(name, N, K, np.random.default_rng(1))
    want = gguf.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(N, K)
    w = reference.repack(fmt, torch.from_numpy(raw), K)
    assert w.shape == (N, K)
    assert np.array_equal(reference.dequantize(w).numpy(), want)
    assert all(t.shape == e.shape and t.dtype == e.dtype for t, e in
               zip(w.tensors().values(), reference.empty_weight(fmt, N, K).tensors().values()))
    if K % reference.RUN == 0:
        stored = 8 * fmt.block_bytes / fmt.block
        assert stored <= w.bits_per_weight() <= stored + (1 / 8 if name in ("Q4_K", "Q5_K") else 0)


def test_layout_rejects_bad_blocks():
    fmt = reference.FORMATS["Q4_K"]
    with pytest.raises(ValueError, match="multiple of 256"):
        reference.repack(fmt, torch.zeros(2, 144, dtype=torch.uint8), 128)
    with pytest.raises(ValueError, match="takes 144 bytes a row"):
        reference.repack(fmt, torch.zeros(2, 140, dtype=torch.uint8), 256)


@pytest.mark.parametrize("name", NAMES)
def test_interpreter_kernel(name, interpreter, poisoned):
    """The GEMV with the bias at 1-16 rows and more (the weight dequantized, then torch's matmul):
    4-6-bit codes (the sliced kernel) with K split in three (the last split ragged: 6 runs), at
    16 rows split in two, and the default tiles; 8-bit codes at one row with 16 groups a tile (one
    block-diagonal dot, the tile past K), three rows with 4 groups a tile and K split in three,
    16 rows a group a tile."""
    from hotpath.ops.gguf import triton_linear

    N, K = 40, 768
    w = weight(name, N, K)
    bias = activations(1, N, seed=9)[0]
    Config = triton_linear.GGUFLinearConfig
    if w.fmt.bits < 8:
        cases = ((1, Config(16, 16, 3, 4, 1)), (16, Config(16, 32, 2, 4, 1)), (3, None), (40, None))
    else:
        cases = ((1, Config(1, 16, 1, 4, 1, 16)), (3, Config(4, 32, 3, 4, 1, 4)), (16, Config(16, 16, 2, 4, 1, 1)),
                 (40, None))
    for M, cfg in cases:
        x = activations(M, K)
        got = triton_linear.gguf_linear(x, w, bias, config=cfg)
        assert rel_err(got, reference.gguf_linear(x, w, bias)) < TOL[torch.float32], (name, M)


@pytest.mark.parametrize("name", [n for n in NAMES if reference.FORMATS[n].block == 32])
def test_interpreter_padded_runs(name, interpreter, poisoned):
    """K = 160, not a multiple of 128: the sliced codes' last run is mostly padding (no scale
    covers it; x's columns past K are never read), at one row with K split in two and at 12."""
    from hotpath.ops.gguf import triton_linear

    w = weight(name, 24, 160)
    for M, cfg in ((1, triton_linear.GGUFLinearConfig(16, 16, 2, 4, 1)), (12, None)):
        x = activations(M, 160)
        assert rel_err(triton_linear.gguf_linear(x, w, config=cfg), reference.gguf_linear(x, w)) < TOL[torch.float32]
    assert torch.equal(triton_linear.dequantize(w, torch.float32), reference.dequantize(w))


@pytest.mark.parametrize("name", NAMES)
def test_interpreter_dequantize(name, interpreter):
    """The dequantize kernel (more rows' path) gives the reference's float32 values exactly (rows
    past a program's tile, groups past K masked)."""
    from hotpath.ops.gguf import triton_linear

    w = weight(name, 70, 768)
    assert torch.equal(triton_linear.dequantize(w, torch.float32), reference.dequantize(w))


def check_fused_forms(name, M, N, K, dtype, device, tol):
    """rms= (plain and gated) and the residual epilogue, through the package's dispatch, against
    the reference ops composed."""
    h, rms = norm_inputs(M, K, dtype, device)
    normed = linear_ref.rms_normalize(h, *rms)
    x = activations(M, K, dtype, device, seed=4)
    w2, w = weight(name, 2 * N, K, device), weight(name, N, K, device, seed=5)
    assert ops_gguf.gguf_fuses(h)
    got = ops_gguf.gguf_linear(h, w, rms=rms)
    assert rel_err(got, reference.gguf_linear(normed, w)) < tol, name
    got = ops_gguf.gguf_linear_silu_and_mul(h, w2, rms=rms)
    assert got.shape == (M, N)
    assert rel_err(got, silu_and_mul(reference.gguf_linear(normed, w2).float())) < tol, name
    residual = activations(M, N, dtype, device, seed=6)
    want = residual.clone()
    want_sumsq = linear_ref.add_residual(reference.gguf_linear(x, w), want)
    got_sumsq = ops_gguf.gguf_linear_add_residual(x, w, residual)
    assert rel_err(residual, want) < tol, name
    assert got_sumsq.shape[1] == M and rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < tol, name


@pytest.mark.parametrize("name,M", [("Q4_K", 1), ("Q5_0", 3), ("Q6_K", 2)])
def test_interpreter_fused_forms(name, M, interpreter, poisoned):
    check_fused_forms(name, M, 24, 512, torch.float32, "cpu", TOL[torch.float32])


def test_dispatch_without_triton_is_the_reference():
    """On the CPU without the Triton backend the ops are the reference (the dequantized weight)."""
    w = weight("Q5_0", 8, 64)
    x = activations(70, 64)
    assert torch.equal(ops_gguf.gguf_linear(x, w), reference.gguf_linear(x, w))


# ---- on a GPU ------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 4, 16, 77, 1000])
def test_cuda_gguf_linear(name, M, gpu_triton, poisoned):
    """bf16 at the 0.5B model's down projection (K 4864, N 896)."""
    K = 4864
    w = weight(name, 896, K, "cuda")
    x = activations(M, K, torch.bfloat16, "cuda")
    bias = torch.randn(896, device="cuda").to(torch.bfloat16)
    got = ops_gguf.gguf_linear(x, w, bias)
    assert rel_err(got, reference.gguf_linear(x.float(), w, bias.float())) < TOL[torch.bfloat16]


@cuda
@pytest.mark.parametrize("name", NAMES)
def test_cuda_dequantize_is_the_16bit_copy(name, gpu_triton):
    """In bf16 the dequantize kernel writes the 16-bit copy's very weights (the float32 values
    rounded once), so more rows compute what the copy's model computes."""
    from hotpath.ops.gguf import triton_linear

    w = weight(name, 896, 4864, "cuda")
    assert torch.equal(triton_linear.dequantize(w, torch.bfloat16), reference.dequantize(w).to(torch.bfloat16))


@cuda
@pytest.mark.parametrize("name", ["Q4_K", "Q5_0", "Q6_K", "Q8_0"])
def test_cuda_fused_forms(name, gpu_triton, poisoned):
    for M in (1, 16):
        check_fused_forms(name, M, 896, 1024, torch.bfloat16, "cuda", TOL[torch.bfloat16])


@cuda
def test_cuda_gguf_linear_in_graph(gpu_triton):
    """The split-K GEMV replays in a CUDA graph (its counters left at zero by every call)."""
    w = weight("Q4_K", 4864, 1024, "cuda")
    x = activations(1, 1024, torch.bfloat16, "cuda")
    want = ops_gguf.gguf_linear(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops_gguf.gguf_linear(x, w)
    for seed in (2, 3):
        x.copy_(activations(1, 1024, torch.bfloat16, "cuda", seed=seed))
        graph.replay()
        assert rel_err(out, ops_gguf.gguf_linear(x, w)) < 1e-6
    assert not torch.equal(out, want)
