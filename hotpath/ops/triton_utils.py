"""Small helpers the Triton kernel modules share (imported only where Triton is)."""

from __future__ import annotations

import torch
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
