"""A kernel launch recorded from the product's own host function, to be compiled without a GPU
(benchmarks/kernel_registers.py, benchmarks/int4_codegen.py).

The host functions pick a kernel's tiles, splits and constexprs; recording the launch they make,
rather than restating their choices here, keeps the compiled kernel the one the product launches.
While `launch` runs, a recorder stands in for the kernels named (unittest.mock.patch.object, put
back whatever happens); nothing runs on a device, so meta tensors do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from unittest import mock


class Launch:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` records the call."""

    def __init__(self, fn, use_pdl: bool | None) -> None:
        self.fn = fn  # the real kernel, to compile
        self.use_pdl = use_pdl
        self.grid = None
        self.args: tuple = ()
        self.kwargs: dict = {}

    def __getitem__(self, grid):
        self.grid = grid
        return self

    def __call__(self, *args, **kwargs) -> None:
        self.args = args
        self.kwargs = {k: v for k, v in kwargs.items() if k != "launch_pdl"}
        if self.use_pdl is not None and "USE_PDL" in self.kwargs:
            self.kwargs["USE_PDL"] = self.use_pdl


@contextlib.contextmanager
def sms_seen(sms: int, *modules):
    """The host functions of `modules` see `sms` SMs on any device (their tiles and splits follow
    it), for as long as the block runs."""
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(mock.patch.object(module, "sm_count", lambda device: sms))
        yield


def capture(module, kernel_name: str, launch: Callable[[], object], others: tuple[str, ...] = (),
            sms: int | None = None, use_pdl: bool | None = True) -> Launch:
    """The launch of `module.kernel_name` that `launch()` makes; `others`: kernels the same call
    launches too, recorded and dropped; `sms`: the SM count the host function sees (its splits
    follow it); `use_pdl`: the USE_PDL the launch is compiled with (None: as the call passed it)."""
    recorders = {name: Launch(getattr(module, name), use_pdl) for name in (kernel_name, *others)}
    with contextlib.ExitStack() as stack:
        for name, recorder in recorders.items():
            stack.enter_context(mock.patch.object(module, name, recorder))
        if sms is not None:
            stack.enter_context(sms_seen(sms, module))
        launch()
    return recorders[kernel_name]
