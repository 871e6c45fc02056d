"""The quantized linear kernels (hotpath/ops/quant) against their torch references.

CPU: the kernels under TRITON_INTERPRET=1 in fp32 at small shapes (the interpreter's bf16 is
wrong without saying so), poisoned outputs. The interpreter handles fp8 tensors (stored as bytes,
decoded exactly) but its fp32 -> fp8 rounding carries no mantissa overflow into the exponent
(126.5 became 64); the quantization kernels round to the e4m3 grid themselves before the cast,
so the cast is exact there and on the GPU, and their fp8 outputs must equal torch's bit for bit.
GPU: bf16 and fp16 at Qwen3-8B's projection shapes and ragged ones (tests marked `cuda`).
"""

from __future__ import annotations

import pytest
import torch

from hotpath.ops import backend, quant
from hotpath.ops.activation.reference import silu_and_mul
from hotpath.ops.linear import reference as linear_ref
from hotpath.ops.quant import reference
from ops_cases import TOL, activations, cuda, norm_inputs, rel_err

FP8 = torch.float8_e4m3fn


# ---- inputs ---------------------------------------------------------------------------------------
def fp8_weight(N, K, block, device="cpu", seed=0):
    """A random fp8 weight and its scales: per channel [N], or per block."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 100).clamp(-448, 448).to(FP8)
    if block is None:
        s = torch.rand(N, generator=g) / 1000 + 1e-5
    else:
        s = torch.rand(-(-N // block[0]), -(-K // block[1]), generator=g) / 1000 + 1e-5
    return w.to(device), s.to(device)


FP8_FORMATS = [None, (16, 64)]  # per-channel, and small blocks (the interpreter's shapes)


# ---- activation quantization (interpreter: exact) ----------------------------------------------------
@pytest.mark.parametrize("dtype", [FP8, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("M,K", [(1, 64), (3, 300), (2, 2500)])
def test_interpreter_quantize_per_token(M, K, dtype, interpreter, poisoned):
    """e4m3fn, and e4m3fnuz (AMD's gfx942: max 240, no -0)."""
    from hotpath.ops.quant import triton_quant

    x = activations(M, K)
    x[0, : K // 2] *= 1e-4  # values in e4m3's subnormal range after scaling, -0 among them
    if M > 1:
        x[1] = 0.0  # an all-zero row: the scale's floor, no division by zero
    got, got_s = triton_quant.quantize_fp8_per_token(x, dtype)
    want, want_s = reference.quantize_fp8_per_token(x, dtype)
    assert torch.equal(got_s, want_s)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("M,K,group", [(2, 128, 128), (3, 300, 128), (1, 100, 32)])
def test_interpreter_quantize_per_group(M, K, group, interpreter, poisoned):
    from hotpath.ops.quant import triton_quant

    x = activations(M, K)
    x[:, :group] *= 1e-3
    got, got_s = triton_quant.quantize_fp8_per_group(x, group, FP8)
    want, want_s = reference.quantize_fp8_per_group(x, group, FP8)
    assert got_s.shape == (M, -(-K // group)) and torch.equal(got_s, want_s)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("M,H", [(1, 64), (5, 300)])
def test_interpreter_fused_add_rms_norm_fp8(M, H, interpreter, poisoned):
    x, residual = activations(M, H), activations(M, H, seed=2)
    weight = torch.rand(H) + 0.5
    got = quant.fused_add_rms_norm_fp8(x, residual, weight, 1e-6, FP8)
    want = reference.fused_add_rms_norm_fp8(x, residual, weight, 1e-6, FP8)
    assert torch.equal(got[2], want[2])
    assert torch.allclose(got[1], want[1], rtol=1e-6)
    # rstd's sum may round differently: at most one fp8 step apart, rarely
    diff = (got[0].float() - want[0].float()).abs()
    assert (diff > 0).float().mean() < 0.01 and (diff <= want[0].float().abs() / 8 + 1e-6).all()


# ---- the GEMV (one or two rows) -----------------------------------------------------------------
# (M, N, K): ragged N and K (not multiples of any tile), rows 1 and 2
GEMV_SHAPES = [(1, 20, 200), (2, 9, 96), (1, 33, 160), (2, 17, 256)]


def fp8_case(M, N, K, block, dtype=torch.float32, device="cpu"):
    w, s = fp8_weight(N, K, block, device)
    return activations(M, K, dtype, device), w, s


@pytest.mark.parametrize("block", FP8_FORMATS)
@pytest.mark.parametrize("M,N,K", GEMV_SHAPES)
def test_interpreter_fp8_gemv(M, N, K, block, interpreter, poisoned):
    """choose_config's tiles, with a bias."""
    from hotpath.ops.quant import triton_gemv

    x, w, s = fp8_case(M, N, K, block)
    b = torch.randn(N)
    got = triton_gemv.fp8_linear(x.view(1, M, K), w, s, block, b)
    assert got.shape == (1, M, N)
    assert rel_err(got, reference.fp8_linear(x, w, s, block, b)) < TOL[torch.float32]


@pytest.mark.parametrize("M", [1, 2])
def test_interpreter_gemv_tiles_walk_k(M, interpreter, poisoned):
    """K walked in several tiles, the last one partly masked, in every fp8 format."""
    from hotpath.ops.quant import triton_gemv
    from hotpath.ops.quant.triton_gemv import QuantGemvConfig

    N, K = 24, 200
    x = activations(M, K)
    for block in FP8_FORMATS:
        w, s = fp8_weight(N, K, block)
        got = triton_gemv.fp8_linear(x, w, s, block, config=QuantGemvConfig(16, 64, 4))
        assert rel_err(got, reference.fp8_linear(x, w, s, block)) < TOL[torch.float32]


def check_fused_forms(M, N, K, dtype, device, tol):
    """rms= (plain and gated) and the residual epilogue, through the package's dispatch, against
    the reference ops composed, for every fp8 format (int4: test_quant_int4.py)."""
    h, rms = norm_inputs(M, K, dtype, device)
    normed = linear_ref.rms_normalize(h, *rms)
    x = activations(M, K, dtype, device, seed=4)
    for block in FP8_FORMATS_FOR[device]:
        fmt = ("fp8", block)
        w2, s2 = fp8_weight(2 * N, K, block, device)
        w, s = fp8_weight(N, K, block, device, seed=5)
        args2, args = (w2, s2, block), (w, s, block)
        lin, gated, resid = quant.fp8_linear, quant.fp8_linear_silu_and_mul, quant.fp8_linear_add_residual
        ref = reference.fp8_linear
        assert quant.gemv_fuses(h)
        got = lin(h, *args2, rms=rms)
        assert rel_err(got, ref(normed, *args2)) < tol, fmt
        got = gated(h, *args2, rms=rms)
        assert got.shape == (M, N)
        assert rel_err(got, silu_and_mul(ref(normed, *args2).float())) < tol, fmt
        residual = activations(M, N, dtype, device, seed=6)
        want = residual.clone()
        want_sumsq = linear_ref.add_residual(ref(x, *args), want)
        got_sumsq = resid(x, *args, residual)
        assert rel_err(residual, want) < tol, fmt
        assert got_sumsq.shape[1] == M and rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < tol, fmt


FP8_FORMATS_FOR = {"cpu": FP8_FORMATS, "cuda": [None, (128, 128)]}


@pytest.mark.parametrize("M,N,K", [(1, 20, 192), (3, 33, 128)])
def test_interpreter_fused_forms(M, N, K, interpreter, poisoned):
    check_fused_forms(M, N, K, torch.float32, "cpu", TOL[torch.float32])


# ---- the GEMMs (many rows) ----------------------------------------------------------------------
def gemm_config():
    from hotpath.ops.quant.triton_gemm import GemmConfig

    return GemmConfig(16, 32, 32, 2, 4, 1)


@pytest.mark.parametrize("block", FP8_FORMATS[:1] + [(16, 32)])
@pytest.mark.parametrize("M,N,K", [(17, 33, 96), (70, 50, 136)])
def test_interpreter_fp8_gemm(M, N, K, block, interpreter, poisoned):
    """x quantized (per token, or per token and group) then fp8 x fp8, scales in the epilogue or
    the main loop; the reference quantizes x the same way."""
    from hotpath.ops.quant import triton_gemm

    x, w, s = fp8_case(M, N, K, block)
    b = torch.randn(N)
    got = triton_gemm.fp8_linear(x, w, s, block, b, config=gemm_config())
    assert rel_err(got, reference.fp8_linear(x, w, s, block, b)) < TOL[torch.float32]


@pytest.mark.parametrize("block", [None, (16, 32)])
def test_interpreter_fp8_gemm_split_k(block, interpreter, poisoned):
    """K split over 3 programs (the last one short), their partials summed in order with the bias."""
    from hotpath.ops.quant import triton_gemm
    from hotpath.ops.quant.triton_gemm import GemmConfig

    x, w, s = fp8_case(5, 40, 224, block)
    b = torch.randn(40)
    config = GemmConfig(16, 32, 32, 2, 4, 1, split_k=3)
    got = triton_gemm.fp8_linear(x, w, s, block, b, config=config)
    assert rel_err(got, reference.fp8_linear(x, w, s, block, b)) < TOL[torch.float32]
    assert triton_gemm.choose_config(32, 128, False, N=4096, K=12288).split_k == 3  # down at 32 rows
    assert triton_gemm.choose_config(32, 128, False, N=24576, K=4096).split_k == 1


def test_interpreter_fnuz_weights(interpreter, poisoned):
    """e4m3fnuz weights (gfx942's fp8, as fp8_e4m3fn_to_fnuz converts them): the GEMV and the
    GEMM, x quantized to e4m3fnuz too."""
    from hotpath.ops.quant import triton_gemm, triton_gemv

    for block in (None, (16, 32)):
        w, s = fp8_weight(33, 96, block)
        w, s = reference.fp8_e4m3fn_to_fnuz(w, s)
        assert w.dtype == torch.float8_e4m3fnuz
        for M in (1, 20):
            x = activations(M, 96)
            op = triton_gemv.fp8_linear if M == 1 else triton_gemm.fp8_linear
            kw = {} if M == 1 else {"config": gemm_config()}
            got = op(x, w, s, block, **kw)
            assert rel_err(got, reference.fp8_linear(x, w, s, block)) < TOL[torch.float32]


def test_reference_fnuz_conversion():
    """Same dequantized values; e4m3fn's -0 becomes 0 (its bits are NaN in e4m3fnuz)."""
    w, s = fp8_weight(16, 64, (8, 32))
    w[0, 0] = -0.0
    w2, s2 = reference.fp8_e4m3fn_to_fnuz(w, s)
    assert torch.equal(reference.dequantize_fp8(w2, s2, (8, 32)), reference.dequantize_fp8(w, s, (8, 32)))


# ---- references and dispatch ---------------------------------------------------------------------
def test_reference_dequantize():
    """The layouts, element by element."""
    w, s = fp8_weight(5, 20, (2, 8))
    deq = reference.dequantize_fp8(w, s, (2, 8))
    assert deq[3, 17] == w[3, 17].float() * s[1, 2]
    w, s = fp8_weight(5, 20, None)
    assert torch.equal(reference.dequantize_fp8(w, s.view(5, 1), None), w.float() * s[:, None])


def test_reference_paths():
    """Up to FP8_GEMV_MAX_ROWS rows the reference keeps x as it is, beyond it quantizes x to fp8."""
    w, s = fp8_weight(8, 64, None)
    few_rows = quant.FP8_GEMV_MAX_ROWS
    x = activations(few_rows + 1, 64)
    few = reference.fp8_linear(x[:few_rows], w, s, None)
    assert torch.allclose(few, x[:few_rows] @ reference.dequantize_fp8(w, s, None).T, rtol=1e-5, atol=1e-5)
    many = reference.fp8_linear(x, w, s, None)
    xq, xs = reference.quantize_fp8_per_token(x)
    assert torch.allclose(many, (xq.float() * xs[:, None]) @ reference.dequantize_fp8(w, s, None).T,
                          rtol=1e-5, atol=1e-5)
    assert not torch.allclose(many[:few_rows], few, rtol=1e-4, atol=1e-4)  # x was quantized


def test_dispatch(monkeypatch):
    """Reference on the CPU; with the triton backend, the fp8 GEMV up to FP8_GEMV_MAX_ROWS rows
    and the GEMM beyond."""
    pytest.importorskip("triton")
    from hotpath.ops.quant import triton_gemm, triton_gemv

    calls = []
    monkeypatch.setattr(triton_gemv, "fp8_linear", lambda *a, **kw: calls.append("gemv"))
    monkeypatch.setattr(triton_gemm, "fp8_linear", lambda *a, **kw: calls.append("gemm"))
    w, s = fp8_weight(8, 32, None)
    previous = backend.get_backend()
    try:
        backend.set_backend("reference")
        quant.fp8_linear(activations(1, 32), w, s, None)
        assert not calls and not quant.gemv_fuses(activations(1, 32))
        backend.set_backend("triton")
        quant.fp8_linear(activations(quant.FP8_GEMV_MAX_ROWS, 32), w, s, None)
        quant.fp8_linear(activations(quant.FP8_GEMV_MAX_ROWS + 1, 32), w, s, None)
        assert calls == ["gemv", "gemm"]
    finally:
        backend.set_backend(previous)


def test_interpreter_dispatch_end_to_end(interpreter, poisoned):
    """The package functions on either side of FP8_GEMV_MAX_ROWS, against the reference (int4:
    test_quant_int4.py)."""
    w, s = fp8_weight(24, 128, None)
    for M in (quant.FP8_GEMV_MAX_ROWS, quant.FP8_GEMV_MAX_ROWS + 1):
        x = activations(M, 128)
        assert rel_err(quant.fp8_linear(x, w, s, None), reference.fp8_linear(x, w, s, None)) < 1e-5


def test_interpreter_rejects_bad_inputs(interpreter):
    from hotpath.ops.quant import triton_gemv

    w, s = fp8_weight(8, 32, None)
    with pytest.raises(ValueError, match="features"):
        triton_gemv.fp8_linear(activations(1, 16), w, s, None)
    with pytest.raises(ValueError, match="block scales"):
        triton_gemv.fp8_linear(activations(1, 32), w, torch.ones(2, 2), (16, 32))


# ---- GPU ------------------------------------------------------------------------------------------
# Qwen3-8B's projections (qkv, o, gate_up, down) and ragged shapes
GPU_SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (1000, 2050), (33, 1024)]
GPU_DTYPES = [torch.bfloat16, torch.float16]


def gpu_fp8_weight(N, K, block):
    w, s = fp8_weight(N, K, block, "cuda")
    return w, s


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("block", [None, (128, 128)])
@pytest.mark.parametrize("N,K", GPU_SHAPES)
@pytest.mark.parametrize("M", [1, 2, 7, 16, 64, 300])
def test_cuda_fp8_linear(M, N, K, block, dtype, gpu_triton, poisoned):
    if block is not None and K % 8:
        pytest.skip("odd K")
    w, s = gpu_fp8_weight(N, K, block)
    x = activations(M, K, dtype, "cuda")
    b = torch.randn(N, device="cuda").to(dtype)
    assert rel_err(quant.fp8_linear(x, w, s, block, b), reference.fp8_linear(x, w, s, block, b)) < TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (2, 1000, 2048), (8, 4096, 12288)])
def test_cuda_fused_forms(M, N, K, dtype, gpu_triton, poisoned):
    check_fused_forms(M, N, K, dtype, "cuda", TOL[dtype])


@cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("M,K", [(1, 4096), (300, 4096), (7, 1000)])
def test_cuda_quantize(M, K, dtype, gpu_triton, poisoned):
    """Bit for bit as torch quantizes (the kernels round to the e4m3 grid in fp32 themselves)."""
    x = activations(M, K, dtype, "cuda")
    for got, want in ((quant.quantize_fp8_per_token(x, FP8), reference.quantize_fp8_per_token(x, FP8)),
                      (quant.quantize_fp8_per_group(x, 128, FP8), reference.quantize_fp8_per_group(x, 128, FP8))):
        assert torch.equal(got[1], want[1])
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    residual, weight = activations(M, K, dtype, "cuda", seed=2), (torch.rand(K, device="cuda") + 0.5).to(dtype)
    got = quant.fused_add_rms_norm_fp8(x, residual, weight, 1e-6, FP8)
    want = reference.fused_add_rms_norm_fp8(x, residual, weight, 1e-6, FP8)
    assert torch.equal(got[2], want[2]) and torch.allclose(got[1], want[1], rtol=1e-5)
    diff = (got[0].float() - want[0].float()).abs()
    assert (diff > 0).float().mean() < 0.01 and (diff <= want[0].float().abs() / 8 + 1e-6).all()


@cuda
def test_cuda_gemv_in_graph(gpu_triton):
    """The decode GEMV replayed in a CUDA graph on fresh inputs (no host sync inside)."""
    w, s = gpu_fp8_weight(4096, 4096, (128, 128))
    x = activations(1, 4096, torch.bfloat16, "cuda")
    quant.fp8_linear(x, w, s, (128, 128))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quant.fp8_linear(x, w, s, (128, 128))
    for seed in range(3):
        x.copy_(activations(1, 4096, torch.bfloat16, "cuda", seed=seed))
        graph.replay()
        assert rel_err(out, reference.fp8_linear(x, w, s, (128, 128))) < TOL[torch.bfloat16]
