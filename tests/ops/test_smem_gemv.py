"""The shared-memory one-row GEMV (Gluon; GPU only: Gluon has no interpreter) against the
reference ops, in the residual form o_proj uses."""

import pytest
import torch

from hotpath.ops.linear import reference
from ops_cases import TOL, cuda, rel_err


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", [(4096, 4096), (1000, 2048), (5120, 8192), (1024, 2048)])
@pytest.mark.parametrize("block_n,chunk_k,num_warps", [(8, 1024, 4), (4, 512, 2), (4, 1024, 4)])
def test_cuda_residual(N, K, dtype, block_n, chunk_k, num_warps, poisoned):
    from hotpath.ops.linear import smem_gemv

    g = torch.Generator("cuda").manual_seed(N + K)
    x = torch.randn(1, K, generator=g, device="cuda").to(dtype)
    weight = (torch.randn(N, K, generator=g, device="cuda") / K**0.5).to(dtype)
    residual = torch.randn(1, N, generator=g, device="cuda").to(dtype)
    want = residual.clone()
    want_sumsq = reference.add_residual(reference.linear(x.float(), weight.float()).to(dtype), want)
    got_sumsq = smem_gemv.linear_add_residual(x, weight, residual, block_n, chunk_k, num_warps)
    assert got_sumsq.shape == (-(-N // block_n), 1)
    assert rel_err(residual, want) < TOL[dtype]
    assert rel_err(got_sumsq.sum(0), want_sumsq.sum(0)) < TOL[dtype]
