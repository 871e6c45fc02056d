"""Server test fixtures: a tiny chat checkpoint and a real `hotpath serve` process on a free
loopback port, driven over HTTP like any client would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_chat_model.py

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


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    from tiny_chat_model import make_tiny_chat_model

    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def server(tiny_chat_model, tmp_path_factory):
    """One server for the API tests: tiny model, API key required, a small body limit."""
    srv = start_server(tiny_chat_model, tmp_path_factory.mktemp("server"), "--api-key", API_KEY,
                       "--served-model-name", "tiny", "--max-request-bytes", "65536")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
