"""benchmarks/allreduce_fused.py (a GPU script) imports and parses its arguments on the CPU, turns
multicast off as it is imported, and reads the switch point off its timings as documented."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "allreduce_fused.py"


def _load(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    spec = importlib.util.spec_from_file_location("allreduce_fused", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_imports_and_parses(monkeypatch):
    bench = _load(monkeypatch)
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    ns = bench.parse_args(["--nproc", "4", "--hidden", "2048"])
    assert (ns.nproc, ns.hidden, ns.cpu) == (4, 2048, False)
    assert bench.SIZES[0] == 4 * 1024 and bench.SIZES[-1] == 64 * 1024 * 1024
    assert bench._shape(4096, 4096) == (1, 2048) and bench._shape(1 << 20, 4096) == (128, 4096)


def test_switch_point(monkeypatch):
    bench = _load(monkeypatch)
    rows = [dict(bytes=b, one_shot_graph_us=o, nccl_graph_us=n)
            for b, o, n in ((4096, 5, 20), (8192, 6, 21), (16384, 30, 22), (32768, 12, 23), (65536, 40, 24))]
    assert bench.switch_point(rows) == 65536  # NCCL wins from here on; 16 KiB was an outlier
    rows[3]["one_shot_graph_us"] = 30
    assert bench.switch_point(rows) == 16384
    assert bench.switch_point(rows[:2]) is None


def test_help_runs():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--nproc" in out.stdout and "--cpu" in out.stdout, out.stderr
