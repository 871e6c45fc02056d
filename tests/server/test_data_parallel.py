"""Two data-parallel replicas of a tiny model behind one `hotpath serve`, driven with the openai
client: both replicas serve, a repeated prefix stays on its replica, n > 1 stays on one, abort and
/metrics see every replica, a killed replica turns /health and new requests into 503, and shutdown
leaves no process behind."""

import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from server_utils import process_alive, start_server

LONG = {"model": "tiny", "prompt": "Hello", "max_tokens": 500, "temperature": 0, "ignore_eos": True}
SHORT = dict(model="tiny", temperature=0, max_tokens=4, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def dp_server(tiny_chat_model, tmp_path_factory):
    srv = start_server(tiny_chat_model, tmp_path_factory.mktemp("dp-server"), "--data-parallel-size", "2",
                       "--served-model-name", "tiny")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(dp_server):
    return openai.OpenAI(base_url=dp_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def per_replica(server, name: str) -> list[float]:
    """One value per replica of a hotpath:dp_* series, in replica order."""
    values = {}
    for key, value in server.metrics().items():
        match = re.fullmatch(rf'hotpath:{name}\{{.*replica="(\d+)"\}}', key)
        if match:
            values[int(match.group(1))] = value
    assert sorted(values) == [0, 1], values
    return [values[0], values[1]]


def engine_pids(server) -> list[int]:
    match = re.search(r"engine processes (\d+), (\d+)", server.log.read_text())
    assert match, server.log.read_text()[-3000:]
    return [int(match.group(1)), int(match.group(2))]


def children(pid: int) -> list[int]:
    """The processes whose parent is pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_completions_and_chat_are_served_by_both_replicas(dp_server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    prompts = ["The quick brown fox", "def add(a, b):", "Hello, world!", "for i in range(10):"]
    for prompt in prompts:  # idle replicas take turns
        out = client.completions.create(prompt=prompt, **SHORT)
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 4
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "Hi there"}], **SHORT)
    assert chat.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "Stream it"}],
                                                 stream=True, **SHORT))
    assert chunks[-1].choices[0].finish_reason == "length"
    streamed = list(client.completions.create(prompt="Continuous batching", stream=True, **SHORT))
    assert "".join(c.choices[0].text for c in streamed) and streamed[-1].choices[0].finish_reason == "length"

    routed = per_replica(dp_server, "dp_requests_routed_total")
    assert sum(routed) == 7 and min(routed) >= 3, routed
    # the engines themselves got them: each counted prompt tokens, and /metrics sums the two
    prompt_tokens = per_replica(dp_server, "dp_prompt_tokens_total")
    assert min(prompt_tokens) > 0
    assert dp_server.gauge("vllm:prompt_tokens_total") == sum(prompt_tokens)
    assert 0.0 <= dp_server.gauge("vllm:kv_cache_usage_perc") <= 1.0


def test_a_repeated_prefix_goes_to_the_replica_that_has_it(dp_server, client):
    prefix = list(range(20, 100))  # five blocks of 16 tokens
    routed_before = per_replica(dp_server, "dp_requests_routed_total")
    prefix_before = per_replica(dp_server, "dp_requests_prefix_routed_total")
    hits_before = dp_server.gauge("vllm:prefix_cache_hits_total")
    for last in (101, 102, 103):
        client.completions.create(prompt=prefix + [last], **SHORT)
    routed = [a - b for a, b in zip(per_replica(dp_server, "dp_requests_routed_total"), routed_before)]
    by_prefix = [a - b for a, b in zip(per_replica(dp_server, "dp_requests_prefix_routed_total"), prefix_before)]
    assert sorted(routed) == [0, 3], routed
    assert by_prefix[routed.index(3)] == 2 and sum(by_prefix) == 2, by_prefix
    # and its cache held them: the second and third prompts found all five blocks
    assert dp_server.gauge("vllm:prefix_cache_hits_total") - hits_before >= 2 * len(prefix)


def test_n_sequences_of_a_request_stay_on_one_replica(dp_server, client):
    before = sum(per_replica(dp_server, "dp_requests_routed_total"))
    out = client.completions.create(prompt="Paged attention", n=3, seed=1, **{**SHORT, "temperature": 1.0})
    assert len(out.choices) == 3
    assert sum(per_replica(dp_server, "dp_requests_routed_total")) == before + 1


def test_a_closed_stream_is_aborted_on_its_replica(dp_server):
    before = dp_server.gauge("hotpath:request_aborted_total")
    generated_before = dp_server.gauge("vllm:generation_tokens_total")
    with httpx.stream("POST", dp_server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()  # kept: dropping it ends the stream and the server aborts
        next(line for line in lines if line.startswith("data:"))
        assert sum(per_replica(dp_server, "dp_requests_in_flight")) == 1
    wait_until(lambda: sum(per_replica(dp_server, "dp_requests_in_flight")) == 0, what="the abort")
    wait_until(lambda: dp_server.gauge("hotpath:request_aborted_total") == before + 1, what="the engine's count")
    assert dp_server.gauge("vllm:num_requests_running") == 0
    assert dp_server.gauge("vllm:generation_tokens_total") - generated_before < 500


def test_a_killed_replica_fails_health_and_requests_and_shutdown_reaps_every_process(dp_server):
    """Runs last: it kills a replica, then stops the module's server."""
    assert httpx.get(dp_server.url + "/health", timeout=10).status_code == 200
    pids = engine_pids(dp_server)
    spawned = children(dp_server.proc.pid)
    assert set(pids) <= set(spawned) and all(process_alive(p) for p in pids)
    with httpx.stream("POST", dp_server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        victim = per_replica(dp_server, "dp_requests_in_flight").index(1)
        os.kill(pids[victim], signal.SIGKILL)
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert rest[-1] == "[DONE]" and "engine process died (killed by SIGKILL" in rest[-2]

    health = httpx.get(dp_server.url + "/health", timeout=10)
    assert health.status_code == 503
    message = health.json()["error"]["message"]
    assert message.startswith(f"data-parallel replica {victim}: engine process died (killed by SIGKILL")
    late = httpx.post(dp_server.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
    assert late.status_code == 503 and late.json()["error"]["message"] == message
    assert per_replica(dp_server, "dp_replica_alive") == [float(i != victim) for i in range(2)]

    assert dp_server.stop() == 0, dp_server.log.read_text()[-3000:]
    wait_until(lambda: not any(process_alive(p) for p in spawned), timeout=10, what="the server's children to exit")
