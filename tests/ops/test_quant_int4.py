"""The int4 kernels (hotpath/ops/quant/triton_int4.py) and their layout against the torch reference.

CPU: the layout checked element by element from its description; the kernels under
TRITON_INTERPRET=1 in fp32 at small shapes (the interpreter's bf16 is wrong without saying so),
poisoned outputs, every group size (32, 64, 128, -1), act-order, every fused form. GPU (tests
marked `cuda`): bf16 and fp16, Qwen shapes (odd K such as 896 and 4864), 1..300 rows, the PTX
dequantization against the portable one, a CUDA graph.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hotpath.ops import quant
from hotpath.ops.activation.reference import silu_and_mul
from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.quant import reference
from ops_cases import TOL, activations, cuda, norm_inputs, rel_err


# ---- inputs ---------------------------------------------------------------------------------------
def int4_weight(N, K, group, act_order, dtype=torch.float32, device="cpu", seed=0):
    """Random words in the int4 layout, scales and zeros [N, groups] (group -1: one group), and
    under act-order the permutation GPTQ's desc_act leaves (act_order_perm of a shuffled g_idx)."""
    g = torch.Generator().manual_seed(seed)
    G = K if group == -1 else group
    q = torch.randint(-2**31, 2**31 - 1, (N, K // 8), generator=g, dtype=torch.int32)
    scales = (torch.rand(N, K // G, generator=g) + 0.1) / 20
    zeros = torch.randint(0, 16, (N, K // G), generator=g, dtype=torch.uint8)
    perm = None
    if act_order:
        g_idx = (torch.randperm(K, generator=g) // G).int()
        perm = reference.act_order_perm(g_idx, G)
    return (q.to(device), scales.to(device, dtype), zeros.to(device),
            None if perm is None else perm.to(device))


# (group, act-order): every group size in the wild
FORMATS = [(32, False), (64, False), (128, False), (-1, False), (128, True), (32, True)]


# ---- the layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("K,group,S", [(128, 32, 16), (896, 128, 16), (4864, 128, 16), (4096, 256, 32),
                                       (4096, -1, 128), (1536, -1, 64), (64, 32, 8)])
def test_layout_element_by_element(K, group, S):
    """Nibble j of word i of superblock b holds stored column 8Sb + jS + i (plain loops)."""
    G = K if group == -1 else group
    assert reference.int4_slice_width(K, G) == S
    q, sc, z, _ = int4_weight(3, K, group, False)
    deq = reference.dequantize_int4(q, sc, z, group)
    for n, w in [(0, 0), (1, K // 8 - 1), (2, K // 16 + 3)]:
        b, i = divmod(w, S)
        for j in range(8):
            col = 8 * S * b + j * S + i
            nib = (int(q[n, w]) >> (4 * j)) & 0xF
            assert deq[n, col] == (nib - int(z[n, col // G])) * sc[n, col // G]
    assert torch.equal(reference.pack_int4_layout(reference.unpack_int4_layout(q, G), G), q)


def test_act_order_perm_and_dequantize():
    """act_order_perm sorts the columns by group (stably); dequantize_int4 with g_idx puts the
    stored columns back in input order."""
    g = torch.Generator().manual_seed(0)
    K, G = 256, 32
    g_idx = (torch.randperm(K, generator=g) // G).int()
    perm = reference.act_order_perm(g_idx, G)
    assert torch.equal(g_idx[perm.long()], torch.arange(K) // G)
    assert all((perm[c * G:(c + 1) * G].diff() > 0).all() for c in range(K // G))  # stable
    q, sc, z, _ = int4_weight(5, K, G, False)
    stored = reference.dequantize_stored(q, sc, z, G)
    assert torch.equal(reference.dequantize_int4(q, sc, z, G, g_idx)[:, perm.long()], stored)
    x = activations(2, K)
    want = x @ reference.dequantize_int4(q, sc, z, G, g_idx).T
    assert rel_err(reference.int4_linear(x, q, sc, z, G, perm), want) < 1e-6
    with pytest.raises(ValueError, match="exactly"):
        reference.act_order_perm(torch.zeros(K, dtype=torch.int32), G)


# ---- the GEMV (interpreter) --------------------------------------------------------------------------
@pytest.mark.parametrize("group,act_order", FORMATS)
@pytest.mark.parametrize("M,N,K", [(1, 20, 256), (2, 9, 128), (3, 33, 384), (16, 17, 256), (20, 9, 128),
                                   (32, 12, 128)])
def test_interpreter_gemv(M, N, K, group, act_order, interpreter, poisoned):
    """choose_gemv_config's tiles, with a bias and x as [1, M, K]."""
    from hotpath.ops.quant import triton_int4

    q, sc, z, perm = int4_weight(N, K, group, act_order)
    x, b = activations(M, K), torch.randn(N)
    got = triton_int4.int4_linear(x.view(1, M, K), q, sc, z, group, perm, b)
    assert got.shape == (1, M, N)
    assert rel_err(got, reference.int4_linear(x, q, sc, z, group, perm, b)) < TOL[torch.float32]


@pytest.mark.parametrize("M,N,K,group", [(1, 8, 896, 128), (3, 24, 1536, -1)])
def test_interpreter_gemv_odd_k(M, N, K, group, interpreter, poisoned):
    """K not a power of 2 (Qwen2.5-0.5B's 896; 1536 with one group: slices of 64)."""
    from hotpath.ops.quant import triton_int4

    q, sc, z, perm = int4_weight(N, K, group, False)
    x = activations(M, K)
    got = triton_int4.int4_linear(x, q, sc, z, group, perm)
    assert rel_err(got, reference.int4_linear(x, q, sc, z, group, perm)) < TOL[torch.float32]


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("M", [1, 5])
def test_interpreter_gemv_configs(M, split, interpreter, poisoned):
    """Other tiles: wider slices walked in 16- and 32-word tiles, K split (the last split short),
    the fused forms over a split."""
    from hotpath.ops.quant import triton_int4

    N, K, group = 24, 1280, -1  # S = 32: 5 superblocks
    q, sc, z, perm = int4_weight(N, K, group, False)
    x = activations(M, K)
    for block_w in (16, 32):
        cfg = triton_int4.Int4GemvConfig(16, block_w, split, 4, 1)
        got = triton_int4.int4_linear(x, q, sc, z, group, perm, config=cfg)
        assert rel_err(got, reference.int4_linear(x, q, sc, z, group, perm)) < TOL[torch.float32]
    residual = activations(M, N, seed=6)
    want = residual.clone()
    want_sumsq = linear_ref.add_residual(reference.int4_linear(x, q, sc, z, group, perm), want)
    got_sumsq = triton_int4.int4_linear_add_residual(x, q, sc, z, group, perm, residual,
                                                     config=triton_int4.Int4GemvConfig(16, 32, split, 4, 1))
    assert rel_err(residual, want) < TOL[torch.float32]
    assert rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < TOL[torch.float32]


def check_fused_forms(M, N, K, dtype, device, tol, formats=FORMATS):
    """rms= (plain and gated) and the residual epilogue, through the package's dispatch, against
    the reference ops composed, for each format."""
    h, rms = norm_inputs(M, K, dtype, device)
    normed = linear_ref.rms_normalize(h, *rms)
    x = activations(M, K, dtype, device, seed=4)
    for group, act_order in formats:
        q2, sc2, z2, perm2 = int4_weight(2 * N, K, group, act_order, dtype, device)
        q, sc, z, perm = int4_weight(N, K, group, act_order, dtype, device, seed=5)
        args2, args = (q2, sc2, z2, group, perm2), (q, sc, z, group, perm)
        fmt = (group, act_order)
        assert quant.gemv_fuses(h)
        got = quant.int4_linear(h, *args2, rms=rms)
        assert rel_err(got, reference.int4_linear(normed, *args2)) < tol, fmt
        got = quant.int4_linear_silu_and_mul(h, *args2, rms=rms)
        assert got.shape == (M, N)
        assert rel_err(got, silu_and_mul(reference.int4_linear(normed, *args2).float())) < tol, fmt
        residual = activations(M, N, dtype, device, seed=6)
        want = residual.clone()
        want_sumsq = linear_ref.add_residual(reference.int4_linear(x, *args), want)
        got_sumsq = quant.int4_linear_add_residual(x, *args, residual)
        assert rel_err(residual, want) < tol, fmt
        assert got_sumsq.shape[1] == M and rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < tol, fmt


@pytest.mark.parametrize("M,N,K", [(1, 20, 256), (3, 33, 128), (16, 8, 128), (30, 8, 128)])
def test_interpreter_fused_forms(M, N, K, interpreter, poisoned):
    check_fused_forms(M, N, K, torch.float32, "cpu", TOL[torch.float32])


# ---- the GEMM (interpreter) ----------------------------------------------------------------------------
def gemm_config(block_w=16):
    from hotpath.ops.quant.triton_int4 import Int4GemmConfig

    return Int4GemmConfig(16, 32, block_w, 2, 4, 1)


@pytest.mark.parametrize("group,act_order", FORMATS)
@pytest.mark.parametrize("M,N,K", [(17, 33, 128), (70, 50, 384)])
def test_interpreter_gemm(M, N, K, group, act_order, interpreter, poisoned):
    from hotpath.ops.quant import triton_int4

    q, sc, z, perm = int4_weight(N, K, group, act_order)
    x, b = activations(M, K), torch.randn(N)
    got = triton_int4.int4_gemm(x, q, sc, z, group, perm, b, config=gemm_config())
    assert rel_err(got, reference.int4_linear(x, q, sc, z, group, perm, b)) < TOL[torch.float32]


def test_interpreter_gemm_choose_config(interpreter, poisoned):
    """choose_gemm_config's own tiles, 300 rows (three M tiles, the last partial), K = 896."""
    from hotpath.ops.quant import triton_int4

    q, sc, z, perm = int4_weight(40, 896, 128, True)
    x = activations(300, 896)
    got = triton_int4.int4_gemm(x, q, sc, z, 128, perm)
    assert rel_err(got, reference.int4_linear(x, q, sc, z, 128, perm)) < TOL[torch.float32]


# ---- dispatch and errors -------------------------------------------------------------------------
def test_interpreter_dispatch_end_to_end(interpreter, poisoned):
    """The package functions on either side of GEMV_MAX_ROWS, against the reference."""
    q, sc, z, perm = int4_weight(24, 128, 32, True)
    for M in (quant.GEMV_MAX_ROWS, quant.GEMV_MAX_ROWS + 1):
        x = activations(M, 128)
        got = quant.int4_linear(x, q, sc, z, 32, perm)
        assert rel_err(got, reference.int4_linear(x, q, sc, z, 32, perm)) < 1e-5


def test_interpreter_rejects_bad_inputs(interpreter):
    from hotpath.ops.quant import triton_int4

    q, sc, z, _ = int4_weight(8, 128, 32, False)
    with pytest.raises(ValueError, match="features"):
        triton_int4.int4_linear(activations(1, 64), q, sc, z, 32)
    with pytest.raises(ValueError, match="scales"):
        triton_int4.int4_linear(activations(1, 128), q, sc[:, :2], z[:, :2], 32)
    with pytest.raises(ValueError, match="multiple of 128"):
        q64, sc64, z64, _ = int4_weight(8, 64, 32, False)
        triton_int4.int4_linear(activations(1, 64), q64, sc64, z64, 32)
    with pytest.raises(ValueError, match="slice width"):
        triton_int4.int4_linear(activations(1, 128), q, sc, z, 32,
                                config=triton_int4.Int4GemvConfig(16, 32, 1, 4, 1))


# ---- GPU ------------------------------------------------------------------------------------------
GPU_DTYPES = [torch.bfloat16, torch.float16]
# Qwen3-8B's qkv, o, gate_up, down; Qwen2.5-0.5B's odd K (896, 4864); a ragged N
GPU_SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (1000, 896), (896, 4864),
              (33, 2048)]


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("group,act_order", FORMATS)
@pytest.mark.parametrize("N,K", GPU_SHAPES)
@pytest.mark.parametrize("M", [1, 2, 3, 16, 17, 32, 33, 300])
def test_cuda_int4_linear(M, N, K, group, act_order, dtype, gpu_triton, poisoned):
    q, sc, z, perm = int4_weight(N, K, group, act_order, dtype, "cuda")
    x = activations(M, K, dtype, "cuda")
    b = torch.randn(N, device="cuda").to(dtype)
    want = reference.int4_linear(x, q, sc, z, group, perm, b)
    assert rel_err(quant.int4_linear(x, q, sc, z, group, perm, b), want) < TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (2, 1000, 896), (3, 896, 4864), (16, 4096, 12288),
                                   (32, 5120, 5120)])
def test_cuda_fused_forms(M, N, K, dtype, gpu_triton, poisoned):
    check_fused_forms(M, N, K, dtype, "cuda", TOL[dtype])


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_cuda_ptx_dequantization_matches_portable(dtype, gpu_triton):
    """The PTX magic-number dequantization gives the same operands as the portable path: the
    outputs agree to the last bit but for the dots' summation order (none: same tiles)."""
    from hotpath.ops.quant import triton_int4

    q, sc, z, perm = int4_weight(4096, 4096, 128, False, dtype, "cuda")
    for M in (1, 16):
        x = activations(M, 4096, dtype, "cuda")
        cfg = triton_int4.choose_gemv_config(M, 4096, 4096, 16, x.device)
        asm = triton_int4.int4_linear(x, q, sc, z, 128, perm, config=cfg)
        plain = triton_int4.int4_linear(x, q, sc, z, 128, perm, config=replace(cfg, asm=False))
        assert torch.equal(asm, plain)
    x = activations(300, 4096, dtype, "cuda")
    cfg = triton_int4.choose_gemm_config(300, 16, x.device)
    asm = triton_int4.int4_gemm(x, q, sc, z, 128, config=cfg)
    plain = triton_int4.int4_gemm(x, q, sc, z, 128, config=replace(cfg, asm=False))
    assert torch.equal(asm, plain)


@cuda
def test_cuda_gemv_in_graph(gpu_triton):
    """The decode GEMV (act-order, K split) replayed in a CUDA graph on fresh inputs."""
    q, sc, z, perm = int4_weight(4096, 4096, 128, True, torch.bfloat16, "cuda")
    x = activations(1, 4096, torch.bfloat16, "cuda")
    quant.int4_linear(x, q, sc, z, 128, perm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quant.int4_linear(x, q, sc, z, 128, perm)
    for seed in range(3):
        x.copy_(activations(1, 4096, torch.bfloat16, "cuda", seed=seed))
        graph.replay()
        assert rel_err(out, reference.int4_linear(x, q, sc, z, 128, perm)) < TOL[torch.bfloat16]
