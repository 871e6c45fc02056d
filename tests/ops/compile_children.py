"""Child processes that compile Triton kernels for other targets beside the rest of the test
session (test_cross_compile, test_moe): one a target, each with an empty Triton cache (every kernel
really compiled, nothing left in ~/.triton), its stdout a JSON of results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


class CompileChildren:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # of the temporary folder holding their Triton cache, stdin, stdout, stderr
        self.children: dict[str, subprocess.Popen] = {}
        self.workdir: Path | None = None

    @property
    def started(self) -> bool:
        return self.workdir is not None

    def start(self, commands: dict[str, tuple[list[str], str | None]], pythonpath: str | None = None) -> None:
        """target -> (arguments after the Python executable, the child's stdin text or None)."""
        self.workdir = Path(tempfile.mkdtemp(prefix=self.prefix))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(self.workdir / "triton-cache")
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
