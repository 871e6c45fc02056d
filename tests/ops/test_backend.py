"""The op dispatch: HOTPATH_OPS / set_backend choose between the reference and the kernels."""

import os
import subprocess
import sys

import pytest
import torch

import hotpath.ops
from hotpath.ops import backend, norm


def test_set_backend_validates():
    with pytest.raises(ValueError, match="reference"):
        hotpath.ops.set_backend("fast")


def test_env_var_is_read_at_import():
    def run(value):
        env = dict(os.environ, HOTPATH_OPS=value)
        code = "import hotpath.ops as o; print(o.get_backend())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    assert run("reference").stdout.strip() == "reference"
    bad = run("cuda")
    assert bad.returncode != 0 and "HOTPATH_OPS must be one of" in bad.stderr


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # make `import triton` fail
        "import hotpath.ops.attention, hotpath.ops.norm, hotpath.ops.rotary, hotpath.ops.activation\n"
        "import hotpath.models.llama\n"
        "import torch, hotpath.ops.sampling as s\n"
        "ids, lps = s.greedy_sample(torch.randn(2, 10))\n"
        "assert not any(m.startswith('triton') and sys.modules[m] for m in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_auto_and_reference_run_the_reference_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(norm.reference, "rms_norm", lambda *a: calls.append(a) or a[0])
    x = torch.randn(2, 8)
    previous = backend.get_backend()
    try:
        for name in ("auto", "reference"):
            hotpath.ops.set_backend(name)
            norm.rms_norm(x, torch.ones(8), 1e-6)
    finally:
        hotpath.ops.set_backend(previous)
    assert len(calls) == 2


def test_triton_backend_runs_the_kernel(interpreter, monkeypatch):
    from hotpath.ops.norm import triton as kernels

    calls = []
    monkeypatch.setattr(kernels, "rms_norm", lambda *a: calls.append(a) or a[0])
    norm.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
    assert len(calls) == 1
