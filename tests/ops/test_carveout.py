"""triton_utils.shared_memory_carveout: every Triton kernel loaded in the process asks for the
given L1 / shared memory split inside the context (the decode graphs keep it), and for the
driver's choice outside."""

import ctypes

import torch

from ops_cases import cuda


def _carveout_of(function: int) -> int:
    value = ctypes.c_int()
    # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
    rc = ctypes.CDLL("libcuda.so.1").cuFuncGetAttribute(ctypes.byref(value), 9, ctypes.c_void_p(function))
    assert rc == 0
    return value.value


@cuda
def test_shared_memory_carveout(gpu_triton):
    from hotpath.ops.norm import triton as norm_triton
    from hotpath.ops.triton_utils import _loaded_kernels, shared_memory_carveout

    # fp32 and widths no other test uses, so that the second launch loads a kernel of its own
    x = torch.randn(3, 200, device="cuda")
    w = torch.rand(200, device="cuda")
    norm_triton.rms_norm(x, w, 1e-6)  # loads the kernel (if no earlier test did)
    torch.cuda.synchronize()
    assert _loaded_kernels, "the load hook recorded no kernel"
    loaded = len(_loaded_kernels)
    with shared_memory_carveout(10):
        assert all(_carveout_of(f) == 10 for f, _ in _loaded_kernels)
        # a kernel loaded inside the context (another specialisation) gets the split too
        norm_triton.rms_norm(x[:, :24].contiguous(), w[:24].contiguous(), 1e-6)
        torch.cuda.synchronize()
        assert len(_loaded_kernels) > loaded
        assert _carveout_of(_loaded_kernels[-1][0]) == 10
    assert all(_carveout_of(f) == -1 for f, _ in _loaded_kernels)
