"""Kernel tests run in two ways:

- on a machine without a GPU, the Triton kernels run on CPU tensors under TRITON_INTERPRET=1 at
  small shapes, in fp32 (the interpreter computes bf16 wrongly without saying so);
- on a GPU, the wider matrix runs natively (tests marked with the `cuda` skip).

TRITON_INTERPRET must be set before a kernel module is imported (triton.jit reads it when a kernel
is defined); hotpath imports its kernel modules lazily, so setting it here is early enough.
"""

import os
from pathlib import Path

import pytest
import torch

from hotpath.ops import backend

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def interpreter():
    """Runs the test's ops through the Triton kernels on CPU tensors, under the interpreter."""
    if not backend.triton_available():
        pytest.skip("triton is not installed: the kernels cannot run under its interpreter")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the cuda tests run these kernels natively")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something other than 1")
    previous = backend.get_backend()
    backend.set_backend("triton")
    yield
    backend.set_backend(previous)


@pytest.fixture
def gpu_triton():
    """Forces the Triton kernels (the default on CUDA tensors anyway) for a cuda test."""
    previous = backend.get_backend()
    backend.set_backend("triton")
    yield
    backend.set_backend(previous)


@pytest.fixture
def poisoned(monkeypatch):
    """Every float tensor from torch.empty / torch.empty_like starts as NaN, so a kernel that leaves
    part of its output (or of a work buffer it later reads) unwritten fails the test."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: fill(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: fill(empty_like(*a, **kw)))


_compiling = []  # the modules whose compile children this session started (test_cross_compile, test_moe)
_COMPILE_MODULES = ("test_cross_compile.py", "test_moe.py")
_COMPILE_GROUP = "compile-children"


def _compile_module(item) -> bool:
    return item.path.name in _COMPILE_MODULES and item.path.parent == Path(__file__).parent


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _start_compiling(session) -> None:
    for item in session.items:
        module = getattr(item, "module", None)
        if _compile_module(item) and hasattr(module, "start_compiling") and module not in _compiling:
            _compiling.append(module)
            module.start_compiling(session.items)


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py's and xdist's (the groups it reads)
def pytest_collection_modifyitems(session, config, items):
    """test_cross_compile's tests run last in the session: its children (started when collection
    ends, below) then compile beside every other test rather than only those before tests/ops,
    and what is left of their work is waited for once, at the end.

    Under pytest-xdist a worker does not know at collection which tests it will run, so no
    children start then: the tests that wait on the compile children (the `compiled` fixture of
    test_cross_compile and of test_moe) are one group, first in the session, and the worker that
    runs it starts both modules' children at its first test (pytest_runtest_setup). While it waits
    on them, the other worker runs the rest of the session."""
    if not _xdist_worker(config):
        items.sort(key=lambda item: item.path.name == "test_cross_compile.py"
                   and item.path.parent == Path(__file__).parent)  # a stable sort: the order kept otherwise
        return
    for item in items:
        if _compile_module(item) and "compiled" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group(_COMPILE_GROUP))
    items.sort(key=lambda item: not (_compile_module(item) and "compiled" in item.fixturenames))


def pytest_collection_finish(session):
    """The compile children of test_cross_compile and test_moe start as soon as their cases are
    known (on one worker only, at its first such test, under pytest-xdist)."""
    if session.config.option.collectonly or _xdist_worker(session.config):
        return
    _start_compiling(session)


def pytest_runtest_setup(item):
    if _xdist_worker(item.config) and _compile_module(item) and "compiled" in item.fixturenames:
        _start_compiling(item.session)


def pytest_sessionfinish(session):
    for module in _compiling:
        module.stop_compiling()
