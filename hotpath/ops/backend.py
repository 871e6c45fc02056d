"""Which implementation the op functions run: the torch reference or the Triton kernels.

`auto` (the default) runs the Triton kernel when the input lives on a GPU and Triton is installed,
and the reference otherwise. `HOTPATH_OPS=reference|triton|auto` sets the choice for the process
(read once, at import); `set_backend` changes it at run time (tests use it to run the kernels on
CPU tensors under TRITON_INTERPRET=1).

Triton is imported only when a kernel is first used, so the package imports without it.
"""

from __future__ import annotations

import importlib.util
import os

import torch

BACKENDS = ("auto", "reference", "triton")


def _check(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}; got {name!r}")
    return name


_backend = _check(os.environ.get("HOTPATH_OPS", "auto").strip().lower() or "auto", "HOTPATH_OPS")
_triton_available = importlib.util.find_spec("triton") is not None


def set_backend(name: str) -> None:
    """Select `auto`, `reference` or `triton` for every op from now on."""
    global _backend
    _backend = _check(name, "the ops backend")
    if _backend == "triton" and not _triton_available:
        raise ValueError("the triton ops backend needs the triton package, which is not installed")


def get_backend() -> str:
    return _backend


def triton_available() -> bool:
    return _triton_available


def use_triton(x: torch.Tensor) -> bool:
    """True when the op called with input `x` should run its Triton kernel."""
    if _backend == "auto":
        return x.is_cuda and _triton_available
    if _backend == "triton":
        if not _triton_available:
            raise RuntimeError("HOTPATH_OPS=triton but the triton package is not installed")
        return True
    return False
