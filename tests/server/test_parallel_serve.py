"""`hotpath serve -tp 2` on the CPU: the official client gets the one-rank server's greedy text
through two worker processes; a worker killed mid-generation fails its request and /health with
503 within seconds, and stopping the server leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from server_utils import process_alive, start_server


def children(pid: int) -> list[int]:
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in kids.read_text().split()] if kids.exists() else []


def workers(server) -> list[int]:
    """The worker processes under the server's engine process."""
    engine = server.engine_pid()
    return [pid for pid in children(engine)
            if b"hotpath.executor.multiproc" in Path(f"/proc/{pid}/cmdline").read_bytes()]


@pytest.fixture(scope="module")
def servers(tiny_chat_model, tmp_path_factory):
    one = start_server(tiny_chat_model, tmp_path_factory.mktemp("tp1"), "--api-key", "k")
    two = start_server(tiny_chat_model, tmp_path_factory.mktemp("tp2"), "--api-key", "k", "-tp", "2")
    yield one, two
    for s in (one, two):
        s.stop()


def chat(server, **kwargs):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=60)
    return client.chat.completions.create(model=client.models.list().data[0].id,
                                          messages=[{"role": "user", "content": "Tell me a story"}],
                                          temperature=0, **kwargs)


def test_tensor_parallel_server_matches_one_rank(servers):
    one, two = servers
    assert len(workers(two)) == 2
    want = chat(one, max_tokens=24).choices[0].message.content
    assert chat(two, max_tokens=24).choices[0].message.content == want
    stream = [c.choices[0].delta.content or "" for c in chat(two, max_tokens=24, stream=True) if c.choices]
    assert "".join(stream) == want


def test_a_dead_worker_gives_503_and_no_process_is_left(servers):
    _, two = servers
    engine, ranks = two.engine_pid(), workers(two)
    client = httpx.Client(base_url=two.url, headers={"Authorization": "Bearer k"}, timeout=60)
    body = {"model": client.get("/v1/models").json()["data"][0]["id"], "prompt": "Once upon a time",
            "max_tokens": 200, "ignore_eos": True, "stream": True}
    start = None
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for i, line in enumerate(response.iter_lines()):
            if i == 2:  # generating: kill rank 1
                os.kill(ranks[1], signal.SIGKILL)
                start = time.monotonic()
            if line.startswith("data: ") and "error" in line:
                break
    assert start is not None and time.monotonic() - start < 10
    deadline = time.monotonic() + 10
    while client.get("/health").status_code != 503:
        assert time.monotonic() < deadline, "the server still reports healthy"
        time.sleep(0.2)
    r = client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 4})
    assert r.status_code == 503
    two.stop()
    for pid in [engine, *ranks]:
        deadline = time.monotonic() + 10
        while process_alive(pid):
            assert time.monotonic() < deadline, f"process {pid} left behind"
            time.sleep(0.2)
