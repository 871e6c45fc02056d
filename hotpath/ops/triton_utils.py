"""Small helpers the Triton kernel modules share (imported only where Triton is)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

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


_counters: dict[tuple[str, torch.device], torch.Tensor] = {}


def zeroed_counters(purpose: str, size: int, device: torch.device) -> torch.Tensor:
    """[size] int32 counters for a kernel whose last program to arrive (an atomic add says which)
    does a final step: allocated once per (purpose, device) as zeros, and left at zero by every
    call, so a CUDA graph can replay them. Shared by every call for that purpose on the device:
    such calls must not run concurrently on two streams."""
    key = (purpose, device)
    if key not in _counters:
        _counters[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _counters[key]


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
# Kernels launched without PDL (torch's, cuBLAS) are ordered as usual, and a PDL kernel may start
# early only behind another PDL kernel. A forward starts behind one launched without PDL (the
# embedding lookup) or a new graph launch, so whatever earlier forwards wrote, such as the KV
# cache rows of earlier steps, is complete before any of its kernels starts and may be read before
# the wait (decode attention prefetches them); what this forward writes may not.

_pdl: dict[int, bool] = {}


def device_target(device: torch.device | int) -> GPUTarget:
    """The Triton target (backend, arch, warp size) of the GPU `device`."""
    with torch.cuda.device(device):
        return triton.runtime.driver.active.get_current_target()


def pdl_supported(target: GPUTarget) -> bool:
    """Whether kernels compiled for `target` can use PDL: NVIDIA compute capability 9.0 or later
    and a Triton that has grid dependency control. Not AMD (ROCm's torch calls its GPUs "cuda"
    too, and an MI300X reports capability 9.4): PDL's griddepcontrol and the L2 prefetch behind
    it are PTX, so there the kernels compile their fallback, USE_PDL=False."""
    return target.backend == "cuda" and target.arch >= 90 and hasattr(tl.extra.cuda, "gdc_wait")


def pdl_enabled(device: torch.device) -> bool:
    """Whether Triton kernels on `device` are launched with PDL: a GPU whose target supports it
    (pdl_supported) and HOTPATH_PDL not set to 0 (for A/B timing)."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _pdl:
        _pdl[index] = os.environ.get("HOTPATH_PDL", "1") != "0" and pdl_supported(device_target(index))
    return _pdl[index]


def pdl_launch(use_pdl: bool) -> dict[str, bool]:
    """The launch options of a kernel launched with PDL or not: fn[grid](..., **pdl_launch(use_pdl)).
    Empty without PDL, since only NVIDIA's Triton knows `launch_pdl` (AMD's rejects the keyword,
    even set to False)."""
    return {"launch_pdl": True} if use_pdl else {}


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


# ---- compiling without a GPU ------------------------------------------------------------------
# triton.compile builds a kernel for any target it has a backend for (its wheel carries NVIDIA's
# ptxas and AMD's linker), so a kernel can be compiled for an NVIDIA or AMD GPU on a machine with
# neither. compile_launch specialises the arguments as a launch on that target would.


def compile_launch(fn, args: tuple, kwargs: dict, target: GPUTarget):
    """`fn` (a @triton.jit kernel, not interpreted) compiled for `target` as the launch
    fn[grid](*args, **kwargs) on a GPU of that target would compile it: Triton's own argument
    specialisation for that backend (16-byte alignment and divisibility by 16; on AMD, buffer
    loads for tensors under 2 GB) and its check of the launch options, which a keyword the
    backend does not know fails. Tensors may be on any device, "meta" included (no memory).
    Returns the CompiledKernel (its .asm holds the binary: "cubin" or "hsaco")."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    # JITFunction.run's steps before its cache lookup (Triton internals)
    backend = make_backend(target)
    bind = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = bind(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


# Registers decide how many programs fit on an SM and a harmless-looking change can double them;
# Triton's wheel carries cuobjdump too, so the count can be read on any Linux machine.


def compiled_resources(fn, args: tuple, kwargs: dict, arch: int = 90) -> tuple[int, int]:
    """(registers a thread, spilled bytes a thread) of `fn` compiled for an NVIDIA GPU of compute
    capability `arch` as the launch fn[grid](*args, **kwargs) would compile it, without a GPU."""
    import re
    import subprocess
    import tempfile

    import triton.backends.nvidia

    kernel = compile_launch(fn, args, kwargs, GPUTarget("cuda", arch, 32))
    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert m, usage
    return int(m.group(1)), int(m.group(2))


# ---- the L1 / shared memory split -------------------------------------------------------------
# An SM's 256 KB of L1 and shared memory are one array, split by a carveout. By default the driver
# picks each kernel's split from its shared memory needs and from the kernels already running, and
# an SM holds programs of one split at a time, so a kernel that gets another split waits for SMs
# to drain. The batch-1 decode step chains ~6 kernels a layer that overlap through PDL, so asking
# every one of them for the same split avoids those waits (docs/decisions.md). Graphs keep
# the split their kernels had when they were captured, so the runner sets it around a capture.
# Only kernels loaded after this module: it records each kernel as Triton loads it (and forgets
# it where Triton unloads it, which Triton 3.7+ does when a compiled kernel is freed).
_loaded_kernels: dict[int, str] = {}  # CUfunction handle -> kernel name
# percent of the array as shared memory, and per kernel name where it differs; -1: the driver's
_carveout: tuple[int, dict[str, int]] = (-1, {})


def _share(name: str) -> int:
    percent, by_kernel = _carveout
    return by_kernel.get(name, percent)


def _record_kernel(module, function, name, metadata_group, hash) -> None:
    _loaded_kernels[function] = name
    if (share := _share(name)) != -1:
        _set_kernel_carveout(function, name, share)


def _forget_kernel(module, function, name, metadata_group, hash) -> None:
    _loaded_kernels.pop(function, None)


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _set_kernel_carveout(function: int, name: str, percent: int) -> None:
    # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
    rc = _libcuda().cuFuncSetAttribute(ctypes.c_void_p(function), 9, ctypes.c_int(percent))
    assert rc == 0, f"cuFuncSetAttribute(carveout) failed for {name}: CUresult {rc}"


_runtime_hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
if torch.version.cuda is not None and hasattr(getattr(_runtime_hooks, "kernel_load_end_hook", None), "add"):
    _runtime_hooks.kernel_load_end_hook.add(_record_kernel)
    if hasattr(getattr(_runtime_hooks, "kernel_unload_hook", None), "add"):
        _runtime_hooks.kernel_unload_hook.add(_forget_kernel)


@contextlib.contextmanager
def shared_memory_carveout(percent: int, by_kernel: dict[str, int] | None = None) -> Iterator[None]:
    """Every Triton kernel (loaded so far, or while inside) asks for `percent` (or, by kernel
    name, `by_kernel`'s) of each SM's L1 / shared memory as shared memory (CUDA only; -1: the
    driver's choice); back to the driver's choice on exit."""
    def set_all(value: tuple[int, dict[str, int]]) -> None:
        global _carveout
        _carveout = value
        for function, name in _loaded_kernels.items():
            _set_kernel_carveout(function, name, _share(name))

    set_all((percent, dict(by_kernel or {})))
    try:
        yield
    finally:
        set_all((-1, {}))
