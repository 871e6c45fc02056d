"""Helpers for the server tests: start `hotpath serve` in a subprocess on a free loopback port, read
its /metrics, find its engine process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

API_KEY = "sk-hotpath-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of /metrics: 'name{labels}' -> value."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
        return values

    def gauge(self, name: str) -> float:
        return next(v for k, v in self.metrics().items() if k.split("{")[0] == name)

    def engine_pid(self) -> int:
        """The engine process's pid, from the startup line."""
        match = re.search(r"engine process (\d+)", self.log.read_text())
        assert match, self.log.read_text()[-3000:]
        return int(match.group(1))


def process_alive(pid: int) -> bool:
    """Whether pid runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def start_server(model: str | Path, tmp_dir: Path, *args: str, timeout: float = 180.0) -> ServerProcess:
    """`hotpath serve` in a subprocess; returns once /health answers 200."""
    for _ in range(3):  # the free port may be taken between the probe and the bind
        port = free_port()
        log = tmp_dir / f"server-{port}.log"
        cmd = [sys.executable, "-m", "hotpath.cli", "serve", "--model", str(model), "--port", str(port),
               "--device", "cpu", *args]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return ServerProcess(proc, url, log)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"server did not become healthy in {timeout}s:\n{log.read_text()[-3000:]}")
        if "address already in use" not in log.read_text().lower():
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    raise RuntimeError("no free port found")
