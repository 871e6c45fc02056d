"""A client that goes away mid-request has its request aborted and its KV blocks freed."""

import time

import httpx

from server_utils import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"model": "tiny", "prompt": "Hello", "max_tokens": 500, "temperature": 0, "ignore_eos": True}


def wait_idle(server, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = {k.split("{")[0]: v for k, v in server.metrics().items()}
        if m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0:
            return m
        assert time.monotonic() < deadline, f"engine still busy after the client left: {m}"
        time.sleep(0.05)


def test_stream_disconnect_frees_kv_blocks(server):
    before = wait_idle(server)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True},
                           headers=HEADERS) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            # the request holds KV blocks while it streams
            assert server.gauge("vllm:kv_cache_usage_perc") > 0
            assert server.gauge("vllm:num_requests_running") == 1
        # leaving the block closes the connection mid-stream
    after = wait_idle(server)
    assert after["hotpath:request_aborted_total"] == before["hotpath:request_aborted_total"] + 1
    # 500 tokens would take far more steps than were run before the abort
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 500


def test_non_streaming_disconnect_frees_kv_blocks(server):
    before = wait_idle(server)
    try:
        httpx.post(server.url + "/v1/completions", json=LONG, headers=HEADERS, timeout=0.2)
    except httpx.ReadTimeout:
        pass
    after = wait_idle(server)
    assert after["hotpath:request_aborted_total"] == before["hotpath:request_aborted_total"] + 1
