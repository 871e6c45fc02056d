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
    """On the GPU: the attribute as the driver reports it."""
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
        assert all(_carveout_of(f) == 10 for f in _loaded_kernels)
        # a kernel loaded inside the context (another specialisation) gets the split too
        norm_triton.rms_norm(x[:, :24].contiguous(), w[:24].contiguous(), 1e-6)
        torch.cuda.synchronize()
        assert len(_loaded_kernels) > loaded
        assert _carveout_of(list(_loaded_kernels)[-1]) == 10
    assert all(_carveout_of(f) == -1 for f in _loaded_kernels)


def test_carveout_bookkeeping(monkeypatch):
    """On any machine: which kernels the context sets, and to what (the driver call stubbed)."""
    from hotpath.ops import triton_utils

    calls = []
    monkeypatch.setattr(triton_utils, "_set_kernel_carveout", lambda f, name, p: calls.append((f, p)))
    monkeypatch.setattr(triton_utils, "_loaded_kernels", {})
    triton_utils._record_kernel(None, 101, "a", None, None)
    triton_utils._record_kernel(None, 102, "b", None, None)
    assert calls == []  # the driver's choice until asked otherwise
    with triton_utils.shared_memory_carveout(10):
        assert sorted(calls) == [(101, 10), (102, 10)]
        triton_utils._record_kernel(None, 103, "c", None, None)  # loaded inside: set at once
        assert calls[-1] == (103, 10)
        triton_utils._forget_kernel(None, 102, "b", None, None)  # unloaded: never touched again
        calls.clear()
    assert sorted(calls) == [(101, -1), (103, -1)]
    calls.clear()
    triton_utils._record_kernel(None, 104, "d", None, None)
    assert calls == []


def test_carveout_by_kernel_name(monkeypatch):
    from hotpath.ops import triton_utils

    calls = []
    monkeypatch.setattr(triton_utils, "_set_kernel_carveout", lambda f, name, p: calls.append((name, p)))
    monkeypatch.setattr(triton_utils, "_loaded_kernels", {})
    triton_utils._record_kernel(None, 1, "_gemv_kernel", None, None)
    with triton_utils.shared_memory_carveout(10, {"_decode_split_kernel": 20}):
        triton_utils._record_kernel(None, 2, "_decode_split_kernel", None, None)
        assert calls == [("_gemv_kernel", 10), ("_decode_split_kernel", 20)]
