"""Small helpers the Triton kernel modules share (imported only where Triton is)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_TL_DTYPES = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}


def tl_dtype(dtype: torch.dtype):
    """The Triton dtype for a torch float dtype (a kernel's rounding or output type)."""
    try:
        return _TL_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"the Triton kernels support float32, float16 and bfloat16, not {dtype}") from None


_num_sms: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (cached); a small stand-in under the interpreter."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _num_sms:
        _num_sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _num_sms[index]


def row_warps(block: int) -> int:
    """Warps for a kernel that handles `block` elements of one row per program."""
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16


# ---- programmatic dependent launch (PDL) ------------------------------------------------------
# On Hopper and later a kernel launched with PDL may start while the kernel before it on the
# stream is still running: its programs become resident as the previous kernel's programs finish,
# and can read whatever the previous kernels do not write (the weights) before waiting. A decode
# step is a chain of several kernels per layer, each a few microseconds long, so the launch
# latency and the tail of every kernel are a large share of it; PDL overlaps them.
#
# The contract, for every kernel launched with `launch_pdl=pdl_enabled(...)`:
#   - call `pdl_launch_dependents(USE_PDL)` early (lets the next kernel start launching once every
#     program of this one has started), and
#   - call `pdl_wait(USE_PDL)` before reading anything an earlier kernel writes, and before writing
#     anything. The wait returns once the previous kernel has completed and its writes are visible;
#     since that kernel waited for its own predecessor, every earlier kernel has completed too.
# Kernels launched without PDL (torch's, cuBLAS) are ordered as usual.

_pdl: dict[int, bool] = {}


def pdl_enabled(device: torch.device) -> bool:
    """Whether Triton kernels on `device` are launched with PDL: CUDA capability 9.0 or later, a
    Triton that has grid dependency control, and HOTPATH_PDL not set to 0 (for A/B timing)."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pdl:
        _pdl[index] = (
            os.environ.get("HOTPATH_PDL", "1") != "0"
            and torch.cuda.get_device_capability(index)[0] >= 9
            and hasattr(tl.extra.cuda, "gdc_wait")
        )
    return _pdl[index]


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Waits for the previous kernel on the stream to complete (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_launch_dependents(USE_PDL: tl.constexpr):
    """Lets the next kernel on the stream begin launching (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
