"""SiLU-and-mul kernel against the reference."""

import pytest
import torch

from hotpath.ops import activation
from hotpath.ops.activation import reference
from ops_cases import TOL, cuda, rel_err


def check(shape, dtype, device):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device, dtype) * 3
    out = activation.silu_and_mul(x)
    want = reference.silu_and_mul(x)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert rel_err(out, want) < TOL[dtype] / 4


@pytest.mark.parametrize("shape", [(1, 32), (5, 2 * 1500), (2, 3, 64)])
def test_interpreter(shape, interpreter, poisoned):
    check(shape, torch.float32, "cpu")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2 * 12288), (333, 2 * 3072), (4096, 2 * 25600)])
def test_cuda(shape, dtype, gpu_triton, poisoned):
    check(shape, dtype, "cuda")
