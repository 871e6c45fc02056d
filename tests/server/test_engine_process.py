"""The engine in its own process: a dead engine process fails requests with 503 instead of hanging,
a dead server takes its engine process with it, startup errors reach the server's exit status, and
the in-process mode still serves."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server_utils import process_alive, start_server

LONG = {"prompt": "Hello", "max_tokens": 400, "temperature": 0, "ignore_eos": True}


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_killed_engine_process_fails_requests_with_503(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, tmp_path)
    first = threading.Event()
    streamed = {"events": [], "status": None}
    plain = {}

    def stream():
        with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True},
                          timeout=60) as resp:
            streamed["status"] = resp.status_code
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    streamed["events"].append(line[6:])
                    first.set()
        first.set()

    def non_streaming():
        resp = httpx.post(server.url + "/v1/completions", json=LONG, timeout=60)
        plain["status"], plain["body"] = resp.status_code, resp.json()

    threads = [threading.Thread(target=stream), threading.Thread(target=non_streaming)]
    for t in threads:
        t.start()
    assert first.wait(60)
    deadline = time.monotonic() + 30
    while server.gauge("vllm:num_requests_running") < 2:  # both in flight
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(server.engine_pid(), signal.SIGKILL)
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request hung after the engine process died"

    expected = "engine process died (killed by SIGKILL, exit code -9); restart the server"
    # the stream had sent its 200 and some text; it ends with an error event, then [DONE]
    assert streamed["status"] == 200 and streamed["events"][-1] == "[DONE]"
    error = json.loads(streamed["events"][-2])["error"]
    assert error["message"] == expected and error["type"] == "server_error"
    assert "finish_reason\":\"length" not in "".join(streamed["events"])
    assert plain["status"] == 503 and plain["body"]["error"]["message"] == expected
    late = httpx.post(server.url + "/v1/completions", json=LONG, timeout=60)
    assert late.status_code == 503 and late.json()["error"]["message"] == expected
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["error"]["message"] == expected
    assert server.stop() == 0, server.log.read_text()[-3000:]


def test_engine_process_exits_when_the_server_dies(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, tmp_path)
    engine_pid = server.engine_pid()
    assert process_alive(engine_pid)
    server.stop(signal.SIGKILL)  # no shutdown: the engine process sees its pipe close
    assert wait_gone(engine_pid), "the engine process outlived the server"


def run_serve(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hotpath.cli", "serve", "--device", "cpu", "--port", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_startup_errors_reach_the_exit_status(tiny_chat_model, tmp_path):
    missing = run_serve("--model", str(tmp_path / "no-such-model"))
    assert missing.returncode == 2 and "hotpath: error:" in missing.stderr, missing.stderr[-3000:]
    assert "no-such-model" in missing.stderr
    too_long = run_serve("--model", str(tiny_chat_model), "--max-model-len", "100000")
    assert too_long.returncode == 2, too_long.stderr[-3000:]
    assert "max_model_len 100000 is larger than the model's max_position_embeddings" in too_long.stderr


def test_in_process_engine_still_serves(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, tmp_path, "--no-engine-process")
    resp = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=60)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
    assert server.stop() == 0
    assert "engine in the server's process" in server.log.read_text()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_pipe_stays_blocking_on_every_loop(tiny_chat_model, loop):
    """uvicorn runs on uvloop where it is installed, and uvloop makes a watched fd non-blocking:
    the client's sends then raised BlockingIOError once 64 streams filled the socket buffer (H200),
    and the engine was declared dead. Messages cross the pipe whole, so it must stay blocking,
    and a burst of large requests must all come back."""
    import asyncio

    from hotpath.args import EngineArgs
    from hotpath.engine.engine_client import EngineClient
    from hotpath.sampling_params import SamplingParams

    if loop == "uvloop":  # in the test extra on Linux, as in the serve extra
        import uvloop

        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop
    client = EngineClient.launch(EngineArgs(model=str(tiny_chat_model), device="cpu"))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    async def burst() -> list[int]:
        client.start()
        assert os.get_blocking(client._conn.fileno())

        async def one(i: int) -> int:
            stream = await client.add_request(f"r{i}", {"prompt_token_ids": [5 + i % 50] * 500}, params)
            final = None
            async for out in stream:
                final = out
            return len(final.outputs[0].token_ids)

        return await asyncio.gather(*(one(i) for i in range(64)))  # more ADD bytes at once than the socket buffer holds

    try:
        event_loop = new_loop()
        assert event_loop.run_until_complete(burst()) == [2] * 64
    finally:
        client.shutdown()
        event_loop.close()


def test_many_requests_at_once_do_not_deadlock_the_pipe(tiny_chat_model):
    """2,000 ShareGPT requests at once through the server never finished on an H200: the event loop
    sat in a blocking send of ADD messages while the engine, between reads, sat in a blocking send
    of STEP messages the loop was not reading. Here more ADD bytes than the socket buffer holds
    arrive while the engine is stepping and streaming many outputs; all must come back."""
    import asyncio

    from hotpath.args import EngineArgs
    from hotpath.engine.engine_client import EngineClient
    from hotpath.sampling_params import SamplingParams

    client = EngineClient.launch(EngineArgs(model=str(tiny_chat_model), device="cpu"))
    # logprobs make each STEP message large, as a GPU's batch of 256 streams makes it
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=20)
    n = 3000

    async def flood() -> list[int]:
        client.start()

        async def one(i: int) -> int:
            prompt = {"prompt_token_ids": [(5 + i + j) % 400 + 5 for j in range(400)]}
            stream = await client.add_request(f"r{i}", prompt, params)
            final = None
            async for out in stream:
                final = out
            return len(final.outputs[0].token_ids)

        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout=120)

    event_loop = asyncio.new_event_loop()
    try:
        assert event_loop.run_until_complete(flood()) == [8] * n
    finally:
        client.shutdown()
        event_loop.close()

