"""The decode forms of small models' layers (DecoderLayer.forward_fused_mlp) against the reference:
the gated MLP in one kernel summing into an fp32 accumulator, the qkv GEMV that adds that
accumulator into the residual stream and normalises it, o_proj clearing the accumulator, and the
final norm of stream + accumulator."""

import pytest
import torch

from hotpath.ops import linear, norm
from hotpath.ops.linear import reference
from hotpath.ops.norm import reference as norm_reference
from ops_cases import TOL, cuda, rel_err


def mlp_inputs(M, H, I, dtype, device, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    x = (torch.randn(M, H, generator=g, device=device) * 3).to(dtype)
    # the statistic as partial sums over three column ranges, as o_proj's tiles leave it
    sumsq = torch.stack([c.float().pow(2).sum(-1) for c in x.tensor_split(3, dim=-1)])
    norm_w = (torch.rand(H, generator=g, device=device) + 0.5).to(dtype)
    gate_up = (torch.randn(2 * I, H, generator=g, device=device) / H**0.5).to(dtype)
    down_t = (torch.randn(I, H, generator=g, device=device) / I**0.5).to(dtype)
    acc = torch.randn(M, H, generator=g, device=device)  # what earlier programs added: kept
    return x, (sumsq, norm_w, 1e-6), gate_up, down_t, acc


def check_mlp(M, H, I, dtype, device, config=None):
    from hotpath.ops.linear import triton_mlp

    x, rms, gate_up, down_t, acc = mlp_inputs(M, H, I, dtype, device)
    want = acc.clone()
    # the reference in fp32 on the kernel's rounded intermediate values
    y = (torch.nn.functional.silu(reference.linear(reference.rms_normalize(x, *rms), gate_up)[:, :I])
         * reference.linear(reference.rms_normalize(x, *rms), gate_up)[:, I:])
    want += y.float() @ down_t.float()
    triton_mlp.gated_mlp_accumulate(x, gate_up, down_t, acc, rms, config=config)
    assert rel_err(acc, want) < TOL[dtype]
    # and the dispatch's reference form is the unfused MLP
    ref_acc = torch.zeros(M, H, device=device)
    reference.gated_mlp_accumulate(x, gate_up, down_t, ref_acc, rms)
    assert torch.allclose(ref_acc, y.float() @ down_t.float())


def check_add_norm(M, N, K, dtype, device):
    from hotpath.ops.linear import triton_gemv

    g = torch.Generator(device).manual_seed(3)
    h = (torch.randn(M, K, generator=g, device=device) * 2).to(dtype)
    acc = torch.randn(M, K, generator=g, device=device) * 2
    weight = (torch.randn(N, K, generator=g, device=device) / K**0.5).to(dtype)
    bias = torch.randn(N, generator=g, device=device).to(dtype)
    norm_w = (torch.rand(K, generator=g, device=device) + 0.5).to(dtype)
    h_out = torch.empty_like(h)
    got = triton_gemv.linear_add_norm(h, acc, weight, bias, norm_w, 1e-6, h_out)
    want_h = torch.empty_like(h)
    want = reference.linear_add_norm(h, acc, weight, bias, norm_w, 1e-6, want_h)
    assert torch.equal(h_out, want_h)  # the sum is rounded once, as the reference rounds it
    assert got.shape == (M, N) and rel_err(got, want) < TOL[dtype]
    # the reference form: the residual add of a rounded projection, then the RMSNorm
    assert torch.equal(want_h, acc.to(dtype) + h)


def check_zero(M, N, K, dtype, device):
    from hotpath.ops.linear import triton_gemv

    g = torch.Generator(device).manual_seed(4)
    x = torch.randn(M, K, generator=g, device=device).to(dtype)
    weight = (torch.randn(N, K, generator=g, device=device) / K**0.5).to(dtype)
    residual = torch.randn(M, N, generator=g, device=device).to(dtype)
    want = residual.clone()
    want_sumsq = reference.add_residual(reference.linear(x.float(), weight.float()).to(dtype), want)
    zero = torch.randn(M, N, device=device)
    got_sumsq = triton_gemv.linear_add_residual(x, weight, residual, zero=zero)
    assert not zero.any()
    assert rel_err(residual, want) < TOL[dtype]
    assert rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < TOL[dtype]


# ---- CPU: the kernels under TRITON_INTERPRET=1, fp32, small shapes ----------------------------
@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("H,I,config", [(64, 48, (8, 4)), (96, 40, (16, 2)), (40, 24, None)])
def test_interpreter_gated_mlp(M, H, I, config, interpreter, poisoned):
    """Intermediate sizes off the program's feature count, hidden sizes off powers of 2."""
    check_mlp(M, H, I, torch.float32, "cpu", config)


@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("N,K", [(48, 64), (33, 96)])
def test_interpreter_add_norm_and_zero(M, N, K, interpreter, poisoned):
    check_add_norm(M, N, K, torch.float32, "cpu")
    check_zero(M, N, K, torch.float32, "cpu")


def test_interpreter_accumulator_rms_norm(interpreter, poisoned):
    g = torch.Generator().manual_seed(6)
    acc, residual = torch.randn(2, 72, generator=g), torch.randn(2, 72, generator=g)
    w = torch.rand(72, generator=g) + 0.5
    want = norm_reference.rms_norm(acc + residual, w, 1e-6)
    assert rel_err(norm.accumulator_rms_norm(acc, residual, w, 1e-6), want) < TOL[torch.float32]


def test_fused_mlp_dispatch():
    """Which MLPs store down_proj transposed for the fused kernel, and which calls take it."""
    from hotpath.layers.activation import GatedMLP

    mlp = GatedMLP(64, 96)
    mlp.transpose_down()  # CPU tensors, auto backend: the reference ops, no kernel to feed
    assert not mlp.down_transposed
    x = torch.randn(1, 64)
    assert not linear.fused_mlp(x, mlp.gate_up_proj.weight, mlp.down_t)
    assert not linear.fused_mlp_fits(torch.empty(2 * 3072, 1024), torch.empty(1024, 3072))


def test_interpreter_transpose_down(interpreter):
    from hotpath.layers.activation import GatedMLP

    mlp = GatedMLP(64, 96)
    torch.nn.init.normal_(mlp.down_proj.weight)
    before = mlp.down_proj.weight.clone()
    mlp.transpose_down()
    assert mlp.down_transposed and mlp.down_t.is_contiguous()
    assert torch.equal(mlp.down_proj.weight, before)  # the same matrix, another layout
    x = torch.randn(2, 64)
    assert linear.fused_mlp(x, mlp.gate_up_proj.weight, mlp.down_t)
    assert not linear.fused_mlp(torch.randn(3, 64), mlp.gate_up_proj.weight, mlp.down_t)
    big = GatedMLP(1024, 8192)  # 25M weight elements
    big.transpose_down()
    assert not big.down_transposed


# ---- GPU ---------------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H,I", [(1024, 3072), (896, 4864), (1000, 2050)])
@pytest.mark.parametrize("M", [1, 2])
def test_cuda_gated_mlp(M, H, I, dtype, poisoned):
    """Qwen3-0.6B's and Qwen2.5-0.5B's MLPs and an odd one, with CONFIGS's tiles and others."""
    for config in (None, (4, 4), (8, 8), (16, 8)):
        check_mlp(M, H, I, dtype, "cuda", config)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N,K", [(4096, 1024), (1152, 896), (1000, 2050)])
@pytest.mark.parametrize("M", [1, 2])
def test_cuda_add_norm_and_zero(M, N, K, dtype, poisoned):
    check_add_norm(M, N, K, dtype, "cuda")
    check_zero(M, K, N, dtype, "cuda")
