"""The embedding lookup with its rows' sums of squares (the first layer's RMSNorm statistic in
decode) against the reference."""

import pytest
import torch

from hotpath.ops.embedding import reference
from ops_cases import TOL, cuda, rel_err


def check(M, vocab, hidden, dtype, device):
    from hotpath.ops.embedding import triton as kernels

    g = torch.Generator(device).manual_seed(M + hidden)
    weight = (torch.randn(vocab, hidden, generator=g, device=device) * 2).to(dtype)
    ids = torch.randint(0, vocab, (M,), generator=g, device=device)
    x, sumsq = kernels.embedding_with_sumsq(ids, weight)
    want_x, want_sumsq = reference.embedding_with_sumsq(ids, weight)
    assert torch.equal(x, want_x)
    assert sumsq.shape == (1, M) and rel_err(sumsq, want_sumsq) < TOL[torch.float32]


@pytest.mark.parametrize("M,hidden", [(1, 64), (2, 40), (5, 100)])
def test_interpreter(M, hidden, interpreter, poisoned):
    check(M, 50, hidden, torch.float32, "cpu")


def test_reference():
    weight = torch.randn(10, 6)
    x, sumsq = reference.embedding_with_sumsq(torch.tensor([3, 3, 7]), weight)
    assert torch.equal(x, weight[[3, 3, 7]])
    assert torch.allclose(sumsq, (weight[[3, 3, 7]] ** 2).sum(-1)[None, :])


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,hidden", [(1, 1024), (2, 4096), (16, 5120), (3, 896)])
def test_cuda(M, hidden, dtype, poisoned):
    check(M, 151936 if hidden == 1024 else 5000, hidden, dtype, "cuda")
