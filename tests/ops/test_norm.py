"""RMSNorm kernels (plain and fused with the residual add) and LayerNorm fused with the residual add, against the reference."""

import pytest
import torch

from hotpath.ops import norm
from hotpath.ops.norm import reference
from ops_cases import TOL, cuda, rel_err


def check(num_tokens, hidden, dtype, device, weight_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g).to(device, dtype)
    residual = torch.randn(num_tokens, hidden, generator=g).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, weight_dtype or dtype)
    # the reference in fp32 on the same (rounded) inputs, except for the rounding points it
    # shares with the kernel: compare against the reference in the kernel's own dtype too
    out = norm.rms_norm(x, weight, 1e-6)
    want = reference.rms_norm(x, weight, 1e-6)
    assert out.dtype == want.dtype and out.shape == want.shape
    assert rel_err(out, want) < TOL[dtype]
    normed, summed = norm.fused_add_rms_norm(x, residual, weight, 1e-6)
    want_normed, want_summed = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(summed, want_summed)
    assert normed.dtype == want_normed.dtype
    assert rel_err(normed, want_normed) < TOL[dtype]
    # the kernel rounds where the reference does: nearly every element agrees to the bit
    if num_tokens * hidden >= 1000:
        assert (normed == want_normed).float().mean() > 0.98


@pytest.mark.parametrize("num_tokens,hidden", [(1, 16), (7, 96), (3, 1000)])
def test_interpreter(num_tokens, hidden, interpreter, poisoned):
    check(num_tokens, hidden, torch.float32, "cpu")


def test_interpreter_head_rows(interpreter, poisoned):
    """QK-norm shape: [tokens, heads, head_dim] from a strided split of the qkv projection."""
    qkv = torch.randn(5, 3 * 4 * 16)
    q = qkv[:, : 4 * 16].reshape(5, 4, 16)
    weight = torch.randn(16)
    assert rel_err(norm.rms_norm(q, weight, 1e-6), reference.rms_norm(q, weight, 1e-6)) < 1e-6


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 4096), (37, 5120), (2048, 4096), (5, 128)])
def test_cuda(num_tokens, hidden, dtype, gpu_triton, poisoned):
    check(num_tokens, hidden, dtype, "cuda")


@cuda
def test_cuda_fp32_weight(gpu_triton, poisoned):
    check(9, 1024, torch.bfloat16, "cuda", weight_dtype=torch.float32)


def check_gated(num_tokens, heads, head_dim, dtype, device, weight_dtype=None, seed=0):
    """Gated DeltaNet's output norm on strided views of a projection, as the layer passes them."""
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(num_tokens, 3 * heads * head_dim + 5, generator=g).to(device, dtype)
    x = torch.randn(num_tokens, heads, head_dim, generator=g).to(device, dtype)
    gate = proj[:, 7 : 7 + heads * head_dim].view(num_tokens, heads, head_dim)
    weight = (1 + 0.1 * torch.randn(head_dim, generator=g)).to(device, weight_dtype or dtype)
    out = norm.gated_rms_norm(x, gate, weight, 1e-6)
    want = reference.gated_rms_norm(x, gate, weight, 1e-6)
    assert out.dtype == want.dtype == dtype and out.shape == want.shape == (num_tokens, heads * head_dim)
    assert rel_err(out, want) < TOL[dtype]
    if num_tokens * heads * head_dim >= 1000:  # rounded where the reference rounds
        assert (out == want).float().mean() > 0.98


@pytest.mark.parametrize("num_tokens,heads,head_dim", [(1, 4, 16), (5, 3, 24), (3, 33, 8)])
def test_interpreter_gated(num_tokens, heads, head_dim, interpreter, poisoned):
    check_gated(num_tokens, heads, head_dim, torch.float32, "cpu")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens,heads", [(1, 32), (9, 16), (4096, 32)])
def test_cuda_gated(num_tokens, heads, dtype, gpu_triton, poisoned):
    check_gated(num_tokens, heads, 128, dtype, "cuda")
    check_gated(num_tokens, heads, 128, dtype, "cuda", weight_dtype=torch.float32)


def check_layer_norm(num_tokens, hidden, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(num_tokens, hidden, generator=g).to(device, dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    bias = (0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
    normed, summed = norm.fused_add_layer_norm(x, residual, weight, bias, 1e-6)
    want_normed, want_summed = reference.fused_add_layer_norm(x, residual, weight, bias, 1e-6)
    assert torch.equal(summed, want_summed)
    assert normed.dtype == want_normed.dtype == dtype and normed.shape == want_normed.shape
    assert rel_err(normed, want_normed) < TOL[dtype]


@pytest.mark.parametrize("num_tokens,hidden", [(1, 16), (7, 96), (3, 1152)])
def test_interpreter_layer_norm(num_tokens, hidden, interpreter, poisoned):
    """LayerNorm with the residual add (the vision towers), hidden sizes under and at a power of two."""
    check_layer_norm(num_tokens, hidden, torch.float32, "cpu")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 1152), (6400, 1152), (37, 1280)])
def test_cuda_layer_norm(num_tokens, hidden, dtype, gpu_triton, poisoned):
    check_layer_norm(num_tokens, hidden, dtype, "cuda")
