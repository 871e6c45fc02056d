"""The GEMV linear kernel against the reference, and the dispatch between them."""

import pytest
import torch

from hotpath.ops import backend, linear
from hotpath.ops.activation.reference import silu_and_mul as silu_and_mul_reference
from hotpath.ops.linear import reference
from ops_cases import TOL, cuda, rel_err


def inputs(M, N, K, dtype, device, bias, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device).to(dtype)
    weight = (torch.randn(N, K, generator=g, device=device) / K**0.5).to(dtype)
    b = torch.randn(N, generator=g, device=device).to(dtype) if bias else None
    return x, weight, b


def check(out, x, weight, bias, tol):
    # the reference in fp32 on the same (rounded) inputs: the kernel accumulates in fp32 too
    want = reference.linear(x.float(), weight.float(), None if bias is None else bias.float())
    assert out.shape == want.shape and out.dtype == x.dtype
    assert rel_err(out, want) < tol


def split_config(use_dot, split_k, block_k=64):
    from hotpath.ops.linear.triton_gemv import GemvConfig

    return GemvConfig(block_n=16, block_k=block_k, split_k=split_k, num_warps=4, num_stages=2,
                      use_dot=use_dot)


# ---- CPU: the kernel under TRITON_INTERPRET=1, fp32, small shapes -----------------------------
def with_paths(shapes):
    """Each (M, ...) shape with both paths where both apply: the element-wise one takes up to
    GEMV_FMA_MAX_ROWS rows."""
    return [(*shape, use_dot) for shape in shapes for use_dot in (False, True)
            if use_dot or shape[0] <= linear.GEMV_FMA_MAX_ROWS]


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(
    "M,N,K,bias,use_dot",
    with_paths([(1, 40, 200, True), (1, 16, 128, False), (3, 33, 96, False), (4, 24, 64, True),
                (16, 17, 130, True)]),
)
def test_interpreter(M, N, K, bias, use_dot, split_k, interpreter, poisoned):
    from hotpath.ops.linear import triton_gemv

    x, weight, b = inputs(M, N, K, torch.float32, "cpu", bias)
    out = triton_gemv.linear(x, weight, b, config=split_config(use_dot, split_k))
    check(out, x, weight, b, TOL[torch.float32])


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("M,N,K,use_dot", with_paths([(1, 20, 200), (1, 8, 128), (2, 9, 100), (5, 33, 96)]))
def test_interpreter_gated(M, N, K, use_dot, split_k, interpreter, poisoned):
    """linear_silu_and_mul: gate and up rows paired per program, odd N included."""
    from hotpath.ops.linear import triton_gemv

    x, weight, _ = inputs(M, 2 * N, K, torch.float32, "cpu", bias=False)
    out = triton_gemv.linear_silu_and_mul(x, weight, config=split_config(use_dot, split_k))
    check_gated(out, x, weight, TOL[torch.float32])


def check_gated(out, x, weight, tol):
    gate_up = reference.linear(x.float(), weight.float())
    want = silu_and_mul_reference(gate_up)
    assert out.shape == want.shape and out.dtype == x.dtype
    assert rel_err(out, want) < tol


def norm_inputs(M, K, device, seed=1):
    """An un-normalised input with its RMSNorm statistic (as partial sums of squares over three
    column ranges, as a previous layer's tiles leave them) and weight."""
    g = torch.Generator(device).manual_seed(seed)
    h = torch.randn(M, K, generator=g, device=device) * 3
    sumsq = torch.stack([c.float().pow(2).sum(-1) for c in h.tensor_split(3, dim=-1)])
    norm_w = torch.rand(K, generator=g, device=device) + 0.5
    return h, sumsq, norm_w


def check_fused_forms(M, N, K, dtype, device, tol, config=None):
    """rms= prologue (plain and gated) and the residual epilogue, against the reference ops."""
    from hotpath.ops.linear import triton_gemv

    h, sumsq, norm_w = norm_inputs(M, K, device)
    h, norm_w = h.to(dtype), norm_w.to(dtype)
    _, weight, _ = inputs(M, 2 * N, K, dtype, device, bias=False)
    rms = (sumsq, norm_w, 1e-6)
    normed = reference.rms_normalize(h, *rms)
    check(triton_gemv.linear(h, weight, config=config, rms=rms), normed, weight, None, tol)
    check_gated(triton_gemv.linear_silu_and_mul(h, weight, config=config, rms=rms), normed, weight, tol)

    x, weight, _ = inputs(M, N, K, dtype, device, bias=False, seed=2)
    residual = torch.randn(M, N, device=device).to(dtype)
    want = residual.clone()
    want_sumsq = reference.add_residual(reference.linear(x.float(), weight.float()).to(dtype), want)
    got_sumsq = triton_gemv.linear_add_residual(x, weight, residual, config=config)
    assert got_sumsq.shape[1] == M and got_sumsq.shape[0] > 1  # one partial per N tile
    assert rel_err(residual, want) < tol
    assert rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < tol
    assert not triton_gemv._counters(x.device).any()


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("M,N,K,use_dot",
                         with_paths([(1, 20, 200), (1, 300, 128), (3, 40, 200), (5, 33, 96)]))
def test_interpreter_fused_norm_and_residual(M, N, K, use_dot, split_k, interpreter, poisoned):
    check_fused_forms(M, N, K, torch.float32, "cpu", TOL[torch.float32],
                      config=split_config(use_dot, split_k))


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("N,K,block_k,tail_k", [(20, 80, 64, 16), (300, 160, 128, 32)])
def test_interpreter_tail_tile(M, N, K, block_k, tail_k, interpreter, poisoned):
    """K in two tiles (block_k then tail_k, both before the wait): plain, gated, RMS prologue
    and residual epilogue."""
    from hotpath.ops.linear import triton_gemv

    x, weight, b = inputs(M, N, K, torch.float32, "cpu", bias=True)
    config = triton_gemv.GemvConfig(8, block_k, 1, 4, 1, False, tail_k)
    check(triton_gemv.linear(x, weight, b, config=config), x, weight, b, TOL[torch.float32])
    check_fused_forms(M, N, K, torch.float32, "cpu", TOL[torch.float32], config=config)


@pytest.mark.parametrize("M,use_dot", [(1, False), (3, False), (3, True)])
def test_interpreter_rms_statistic_in_many_parts(M, use_dot, interpreter, poisoned):
    """The rms= prologue adds more partial sums than one load takes (1,500: over the one-row
    path's 1,024 and the tensor-core path's 64 per round), as a wide model's producer leaves."""
    from hotpath.ops.linear import triton_gemv

    g = torch.Generator().manual_seed(5)
    h = torch.randn(M, 3000, generator=g) * 3
    sumsq = torch.stack([c.pow(2).sum(-1) for c in h.tensor_split(1500, dim=-1)])  # [1500, M]
    norm_w = torch.rand(3000, generator=g) + 0.5
    weight = torch.randn(40, 3000, generator=g) / 3000**0.5
    rms = (sumsq, norm_w, 1e-6)
    got = triton_gemv.linear(h, weight, config=split_config(use_dot, 1, block_k=1024), rms=rms)
    check(got, reference.rms_normalize(h, *rms), weight, None, TOL[torch.float32])


def test_dispatch_fused_forms_reference():
    """The reference side of the fused forms equals the unfused ops they replace."""
    from hotpath.ops.norm import reference as norm_reference

    h, sumsq, norm_w = norm_inputs(3, 64, "cpu")
    _, weight, _ = inputs(3, 16, 64, torch.float32, "cpu", bias=False)
    assert torch.allclose(linear.linear(h, weight, rms=(sumsq, norm_w, 1e-6)),
                          norm_reference.rms_norm(h, norm_w, 1e-6) @ weight.t(), atol=1e-5)
    residual = torch.randn(3, 16)
    x, _, _ = inputs(3, 16, 64, torch.float32, "cpu", bias=False)
    y = x @ weight.t()
    want_normed, want_sum = norm_reference.fused_add_rms_norm(y, residual.clone(), norm_w[:16], 1e-6)
    got_sumsq = linear.linear_add_residual(x, weight, residual)
    assert torch.allclose(residual, want_sum, atol=1e-6)
    assert torch.allclose(reference.rms_normalize(residual, got_sumsq, norm_w[:16], 1e-6), want_normed,
                          atol=1e-5)


def test_interpreter_default_config(interpreter, poisoned):
    """choose_config's own choice (at 2 rows K whole in one tile; at 6 tensor cores, K split
    on this tall, narrow shape), leading dims kept."""
    from hotpath.ops.linear import triton_gemv

    for M in (2, 6):  # element-wise, tensor cores
        x, weight, b = inputs(M, 24, 2100, torch.float32, "cpu", bias=True)
        cfg = triton_gemv.choose_config(M, 24, 2100, x.device)
        assert cfg.use_dot == (M > linear.GEMV_FMA_MAX_ROWS) and (cfg.split_k > 1) == cfg.use_dot
        out = triton_gemv.linear(x.view(1, M, 2100), weight, b)
        assert out.shape == (1, M, 24)
        check(out.view(M, 24), x, weight, b, TOL[torch.float32])


def test_gemv_config_at_few_rows():
    """At M = 1 (and up to GEMV_FMA_MAX_ROWS): all of K in one tile, unsplit, up to WHOLE_K, or in two where K is WHOLE_K
    and a power of 2 up to WHOLE_K / 4; a multiple of WHOLE_K walks WHOLE_K-wide tiles unsplit
    where the rows fill the SMs; other long K walks narrower tiles and may be split (the CPU
    stand-in has 4 SMs)."""
    from hotpath.ops.linear import triton_gemv

    cpu = torch.device("cpu")
    for K in (3072, 3584):
        whole = triton_gemv.choose_config(1, 4096, K, cpu)
        assert (whole.block_k, whole.tail_k, whole.split_k, whole.use_dot) == (4096, 0, 1, False)
    two = triton_gemv.choose_config(1, 4096, 5120, cpu)
    assert (two.block_k, two.tail_k, two.split_k) == (4096, 1024, 1)
    assert triton_gemv.choose_config(1, 4096, 6144, cpu).tail_k == 0
    walk = triton_gemv.choose_config(1, 4096, 12288, cpu)  # 512 N tiles fill 4 SMs
    assert (walk.block_k, walk.tail_k, walk.split_k, walk.num_warps) == (triton_gemv.WHOLE_K, 0, 1, 8)
    long_k = triton_gemv.choose_config(1, 4096, 25600, cpu)  # not a multiple: no split either
    assert long_k.block_k < triton_gemv.WHOLE_K and long_k.split_k == 1
    for K in (12288, 25600):
        narrow = triton_gemv.choose_config(1, 8, K, cpu)  # one N tile
        assert narrow.block_k < triton_gemv.WHOLE_K and narrow.split_k > 1
    # a few rows on a small weight take the one-row configs in 4-row tiles; more rows, or a large
    # weight, tensor cores
    for N, K in ((1024, 3072), (6144, 1024), (8, 25600)):
        one = triton_gemv.choose_config(1, N, K, cpu)
        for M in range(2, linear.GEMV_FMA_MAX_ROWS + 1):
            few = triton_gemv.choose_config(M, N, K, cpu)
            assert (few.block_n, few.block_k, few.use_dot) == (4, one.block_k, False)
        assert triton_gemv.choose_config(linear.GEMV_FMA_MAX_ROWS + 1, N, K, cpu).use_dot
    assert triton_gemv.choose_config(2, 4096, 4096, cpu).use_dot


def test_gemv_config_short_2048_wide(monkeypatch):
    """One row of a 2048-wide weight short enough for 16-row tiles on half the SMs (Qwen3-0.6B's
    o_proj on an H200's 132) takes them; taller or wider weights, or two rows, do not."""
    from hotpath.ops.linear import triton_gemv

    monkeypatch.setattr(triton_gemv, "sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    o_proj = triton_gemv.choose_config(1, 1024, 2048, cpu)
    assert (o_proj.block_n, o_proj.block_k, o_proj.split_k, o_proj.num_warps) == (16, 2048, 1, 8)
    for M, N, K in ((1, 2048, 2048), (1, 1024, 3072), (1, 1024, 1024), (2, 1024, 2048)):
        assert triton_gemv.choose_config(M, N, K, cpu).block_n < 16


def test_interpreter_split_counters_reset(interpreter):
    """Each call leaves the split-K counters at zero, for the next call or graph replay."""
    from hotpath.ops.linear import triton_gemv

    x, weight, _ = inputs(1, 48, 256, torch.float32, "cpu", bias=False)
    for seed in range(2):
        x = torch.randn(1, 256, generator=torch.Generator().manual_seed(seed))
        check(triton_gemv.linear(x, weight, config=split_config(False, 4)), x, weight, None, 1e-5)
        assert not triton_gemv._counters(x.device).any()


def test_interpreter_rejects_bad_shapes(interpreter):
    from hotpath.ops.linear import triton_gemv

    with pytest.raises(ValueError, match="features"):
        triton_gemv.linear(torch.randn(1, 8), torch.randn(4, 16))
    with pytest.raises(ValueError, match=f"at most {triton_gemv.FMA_BLOCK_M} rows"):
        triton_gemv.linear(torch.randn(triton_gemv.FMA_BLOCK_M + 1, 16), torch.randn(4, 16),
                           config=split_config(False, 1))


# ---- the dispatch --------------------------------------------------------------------------------
def test_dispatch(monkeypatch):
    pytest.importorskip("triton")
    from hotpath.ops.linear import triton_gemv

    calls = []
    monkeypatch.setattr(triton_gemv, "linear", lambda *a, **kw: calls.append(a) or reference.linear(*a))
    w16 = torch.randn(8, 32, dtype=torch.bfloat16)
    previous = backend.get_backend()
    try:
        backend.set_backend("reference")
        linear.linear(torch.randn(1, 32, dtype=torch.bfloat16), w16)
        assert not calls
        backend.set_backend("triton")
        linear.linear(torch.randn(2, 3, 32, dtype=torch.bfloat16), w16)  # 6 rows, short weight
        tall = torch.randn(64, 32, dtype=torch.bfloat16)
        linear.linear(torch.randn(1, 32, dtype=torch.bfloat16), tall)  # 1 row: any shape
        assert len(calls) == 2
        linear.linear(torch.randn(2, 32, dtype=torch.bfloat16), tall)  # FMA rows: any shape
        assert len(calls) == 3
        linear.linear(torch.randn(6, 32, dtype=torch.bfloat16), tall)  # more rows, tall weight
        linear.linear(torch.randn(17, 32, dtype=torch.bfloat16), w16)  # too many rows
        linear.linear(torch.randn(1, 32, dtype=torch.float64), w16.double())  # fp64
        linear.linear(torch.randn(1, 32, dtype=torch.bfloat16), w16.t().contiguous().t())  # strided
        assert len(calls) == 3
    finally:
        backend.set_backend(previous)


def test_reference_out_dtype():
    x, weight, b = inputs(3, 5, 7, torch.float32, "cpu", bias=True)
    out = linear.linear(x, weight, b, out_dtype=torch.float64)
    assert out.dtype == torch.float64 and torch.equal(out, (x @ weight.t() + b).double())


def test_reference_is_f_linear():
    x, weight, b = inputs(3, 5, 7, torch.float32, "cpu", bias=True)
    assert torch.equal(reference.linear(x, weight, b), x @ weight.t() + b)


# ---- GPU -----------------------------------------------------------------------------------------
# odd shapes (N and K off every tile size), Qwen3-0.6B's projections, a Qwen3-8B one, two
# Qwen3-32B ones (K in two tiles at one row; K walked in two whole-K tiles)
GPU_SHAPES = [(33, 1000), (1000, 2050), (4096, 1024), (1024, 3072), (6144, 4096), (10240, 5120),
              (5120, 8192)]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", GPU_SHAPES)
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 16])
def test_cuda(M, N, K, dtype, poisoned):
    """The kernel with choose_config's tiles (whether or not the dispatch would pick it)."""
    from hotpath.ops.linear import triton_gemv

    for bias in (False, True):
        x, weight, b = inputs(M, N, K, dtype, "cuda", bias, seed=M + N)
        check(triton_gemv.linear(x, weight, b), x, weight, b, TOL[dtype])


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", [(3072, 1024), (12288, 4096), (500, 2050), (25600, 5120)])
@pytest.mark.parametrize("M", [1, 2, 4, 8])
def test_cuda_gated(M, N, K, dtype, poisoned):
    """linear_silu_and_mul at Qwen3-0.6B's and -8B's gate_up shapes and an odd one."""
    from hotpath.ops.linear import triton_gemv

    x, weight, _ = inputs(M, 2 * N, K, dtype, "cuda", bias=False, seed=N)
    check_gated(triton_gemv.linear_silu_and_mul(x, weight), x, weight, TOL[dtype])


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N,K", [(1024, 2048), (4096, 12288), (1000, 2050), (5120, 5120)])
@pytest.mark.parametrize("M", [1, 2, 3, 8])
def test_cuda_fused_norm_and_residual(M, N, K, dtype, poisoned):
    """The rms= prologue and residual epilogue at Qwen3 o_proj / down_proj shapes and an odd one,
    with choose_config's tiles (split K included)."""
    check_fused_forms(M, N, K, dtype, "cuda", TOL[dtype])


@cuda
@pytest.mark.parametrize("use_dot", [False, True])
def test_cuda_split_k_repeated_and_in_graph(use_dot, gpu_triton):
    """Split-K many times over (a missing barrier or fence would show as an occasional wrong sum),
    then replayed in a CUDA graph on fresh inputs (the counters must reset every call)."""
    from hotpath.ops.linear import triton_gemv

    M = 4 if use_dot else 1
    x, weight, b = inputs(M, 512, 8192, torch.bfloat16, "cuda", bias=True)
    cfg = split_config(use_dot, split_k=16, block_k=256)
    want = triton_gemv.linear(x, weight, b, config=cfg)
    check(want, x, weight, b, TOL[torch.bfloat16])
    for _ in range(200):
        assert torch.equal(triton_gemv.linear(x, weight, b, config=cfg), want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_gemv.linear(x, weight, b, config=cfg)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_gemv.linear(x, weight, b, config=cfg)
    for seed in range(5):
        g = torch.Generator("cuda").manual_seed(seed)
        x.copy_(torch.randn(M, 8192, generator=g, device="cuda"))
        graph.replay()
        check(out, x, weight, b, TOL[torch.bfloat16])
    assert not triton_gemv._counters(x.device).any()


@cuda
@pytest.mark.parametrize("M", [1, 4])
def test_cuda_fp32_output_of_bf16(M, poisoned):
    """out_dtype=fp32 (the LM head's logits): the bf16 projection's values, stored as fp32."""
    from hotpath.ops.linear import triton_gemv

    x, weight, b = inputs(M, 1000, 2048, torch.bfloat16, "cuda", bias=True)
    out = triton_gemv.linear(x, weight, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out, out.to(torch.bfloat16).float())  # rounded to bf16 first
    check(out.to(torch.bfloat16), x, weight, b, TOL[torch.bfloat16])


@cuda
def test_cuda_lm_head_shape(poisoned):
    """Qwen3's LM head through the dispatch: 151936 x 4096, 1.2 GB of weight, one row."""
    x, weight, _ = inputs(1, 151936, 4096, torch.bfloat16, "cuda", bias=False)
    assert linear.use_gemv(x, weight)
    check(linear.linear(x, weight), x, weight, None, TOL[torch.bfloat16])
