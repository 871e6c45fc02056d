"""Child processes that compile Triton kernels for other targets beside the rest of the test
session (test_cross_compile, test_moe): one a target, its stdout a JSON of results. Every child of
the session shares one Triton cache, empty when the first starts and removed when the last set
stops (every kernel really compiled, nothing left in ~/.triton): a binary both files' children
need (the same compile key: test_moe's MoE launches at Qwen3-30B-A3B's shapes that
test_cross_compile's MoE run also makes) is compiled once, by whichever child gets to it first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


_cache: dict = {"dir": None, "users": 0}  # the Triton cache shared by every started set of children


def _use_cache() -> Path:
    if _cache["dir"] is None:
        _cache["dir"] = Path(tempfile.mkdtemp(prefix="hotpath-compile-cache-"))
    _cache["users"] += 1
    return _cache["dir"]


def _release_cache() -> None:
    _cache["users"] -= 1
    if _cache["users"] == 0:
        shutil.rmtree(_cache["dir"], ignore_errors=True)
        _cache["dir"] = None


class CompileChildren:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # of the temporary folder holding their stdin, stdout, stderr
        self.children: dict[str, subprocess.Popen] = {}
        self.workdir: Path | None = None

    @property
    def started(self) -> bool:
        return self.workdir is not None

    def start(self, commands: dict[str, tuple[list[str], str | None]], pythonpath: str | None = None) -> None:
        """target -> (arguments after the Python executable, the child's stdin text or None)."""
        self.workdir = Path(tempfile.mkdtemp(prefix=self.prefix))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(_use_cache())
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
        for target, (args, stdin) in commands.items():
            files = {kind: self.workdir / f"{target}.{kind}" for kind in ("in", "out", "err")}
            files["in"].write_text(stdin or "")
            with open(files["in"]) as i, open(files["out"], "w") as o, open(files["err"], "w") as e:
                self.children[target] = subprocess.Popen([sys.executable, *args], env=env, stdin=i, stdout=o, stderr=e)

    def results(self, timeout: float) -> dict[str, dict]:
        """target -> the child's JSON output, once it has ended (its stderr's tail if it failed)."""
        out = {}
        for target, child in self.children.items():
            child.wait(timeout=timeout)
            assert child.returncode == 0, (self.workdir / f"{target}.err").read_text()[-3000:]
            out[target] = json.loads((self.workdir / f"{target}.out").read_text())
        return out

    def stop(self) -> None:
        """Ends the children (a session stopped early) and removes their files."""
        for child in self.children.values():
            child.kill()
            child.wait()
        self.children.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            _release_cache()
