"""The distributed tests run on the CPU: the one-shot kernel under the Triton interpreter (set
before any kernel module is imported, as tests/ops does), the collectives over real gloo groups
on loopback."""

import os

import pytest
import torch

from hotpath.ops import backend

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def interpreter():
    """The one-shot kernel runs on CPU tensors under the interpreter."""
    if not backend.triton_available():
        pytest.skip("triton is not installed: the kernel cannot run under its interpreter")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: benchmarks/allreduce_fused.py checks the kernel there")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something other than 1")


@pytest.fixture
def poisoned(monkeypatch):
    """Every float tensor from torch.empty / torch.empty_like starts as NaN, so output the kernel
    leaves unwritten fails the test."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: fill(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: fill(empty_like(*a, **kw)))
