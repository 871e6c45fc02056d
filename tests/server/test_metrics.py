"""/metrics: vLLM's metric names, labels and buckets through prometheus_client, read back with its
own text parser; the engine's counters reach it from the engine process as a snapshot."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
import openai
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from hotpath.engine.front import EngineStats, ReplicaStats
from hotpath.outputs import CompletionOutput, RequestOutput
from hotpath.server.metrics import TTFT_BUCKETS, ServerMetrics, buckets_1_2_5, observe_repeated
from server_utils import API_KEY

MODEL = "tiny"


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample: (sample name, its labels) -> value, through prometheus_client's parser."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"model_name": MODEL, **labels}.items()))]


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


class FakeFront:
    """The parts of an EngineFront that ServerMetrics reads."""

    def __init__(self, stats: EngineStats, replicas: list[ReplicaStats] = ()) -> None:
        self.info = SimpleNamespace(max_model_len=4096)
        self.stats = stats
        self._replicas = list(replicas)

    def replicas(self) -> list[ReplicaStats]:
        return self._replicas


def finished(prompt_len: int, lengths: list[int], arrival=10.0, first=10.5, done=12.5, **extra) -> RequestOutput:
    outputs = [CompletionOutput(i, "", [1] * n, None, None, finish_reason="length") for i, n in enumerate(lengths)]
    metrics = {"arrival_time": arrival, "first_token_time": first, "finished_time": done, **extra}
    return RequestOutput("r", None, [0] * prompt_len, outputs, True, metrics=metrics)


def test_engine_snapshot_and_request_histograms_under_vllm_names():
    stats = EngineStats(num_running=2, num_waiting=1, kv_cache_usage=0.25, prefix_queried_tokens=64,
                        prefix_hit_tokens=32, num_preemptions=3, prompt_tokens=100, generation_tokens=40,
                        num_steps=7, num_aborted=1)
    metrics = ServerMetrics(MODEL, FakeFront(stats))
    # queued 0.25 s, prefill 0.25 s, 4 decode steps of 0.5 s each
    metrics.observe_finished(finished(12, [5], first_scheduled_time=10.25))
    metrics.count_http("/v1/completions", 200)
    text = metrics.render().decode()
    s = scrape(text)
    assert value(s, "vllm:num_requests_running") == 2 and value(s, "vllm:num_requests_waiting") == 1
    assert value(s, "vllm:kv_cache_usage_perc") == 0.25
    assert value(s, "vllm:prefix_cache_queries_total") == 64 and value(s, "vllm:prefix_cache_hits_total") == 32
    assert value(s, "vllm:num_preemptions_total") == 3
    assert value(s, "vllm:prompt_tokens_total") == 100 and value(s, "vllm:generation_tokens_total") == 40
    assert value(s, "hotpath:engine_steps_total") == 7 and value(s, "hotpath:request_aborted_total") == 1
    assert value(s, "vllm:request_success_total", finished_reason="length") == 1
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 0
    assert s[("hotpath:http_requests_total", frozenset({"route": "/v1/completions", "status": "200"}.items()))] == 1
    assert value(s, "vllm:time_to_first_token_seconds_count") == 1
    assert value(s, "vllm:time_to_first_token_seconds_sum") == 0.5
    assert value(s, "vllm:time_to_first_token_seconds_bucket", le="0.5") == 1
    assert value(s, "vllm:time_to_first_token_seconds_bucket", le="0.25") == 0
    assert value(s, "vllm:e2e_request_latency_seconds_sum") == 2.5
    assert value(s, "vllm:request_time_per_output_token_seconds_sum") == 0.5
    assert value(s, "vllm:inter_token_latency_seconds_count") == 4
    assert value(s, "vllm:inter_token_latency_seconds_sum") == 2.0
    assert value(s, "vllm:request_prompt_tokens_sum") == 12 and value(s, "vllm:request_generation_tokens_sum") == 5
    assert value(s, "vllm:request_queue_time_seconds_sum") == 0.25
    assert value(s, "vllm:request_prefill_time_seconds_sum") == 0.25
    assert value(s, "vllm:request_decode_time_seconds_sum") == 2.0
    assert value(s, "vllm:request_inference_time_seconds_sum") == 2.25
    fams = families(text)
    # vLLM's buckets: TTFT's, and 1-2-5 up to max_model_len for token counts
    ttft_bounds = [float(x.labels["le"]) for x in fams["vllm:time_to_first_token_seconds"].samples
                   if x.name.endswith("_bucket")]
    assert ttft_bounds == [*TTFT_BUCKETS, float("inf")]
    assert buckets_1_2_5(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert fams["vllm:prompt_tokens"].type == "counter" and fams["vllm:kv_cache_usage_perc"].type == "gauge"
    # no speculative decoding, no data parallelism: their series are absent
    assert not any(name.startswith(("vllm:spec_decode", "hotpath:dp_")) for name in fams)


def test_speculative_and_per_replica_series():
    replica_stats = [EngineStats(prompt_tokens=30, spec_num_drafts=4, spec_num_draft_tokens=8,
                                 spec_num_accepted_tokens=5, spec_accepted_per_pos=(3, 2)),
                     EngineStats(prompt_tokens=12, spec_num_drafts=1, spec_num_draft_tokens=2,
                                 spec_num_accepted_tokens=1, spec_accepted_per_pos=(1, 0))]
    replicas = [ReplicaStats(routed=3, prefix_routed=1, in_flight=0, alive=True, stats=replica_stats[0]),
                ReplicaStats(routed=1, prefix_routed=0, in_flight=1, alive=False, stats=replica_stats[1])]
    metrics = ServerMetrics(MODEL, FakeFront(EngineStats.combined(replica_stats), replicas))
    # 9 tokens, 4 of them accepted drafts: 4 steps after the first token
    metrics.observe_finished(finished(3, [9], spec_num_accepted_tokens=4))
    s = scrape(metrics.render().decode())
    assert value(s, "vllm:prompt_tokens_total") == 42  # the replicas' sum
    assert value(s, "vllm:spec_decode_num_drafts_total") == 5
    assert value(s, "vllm:spec_decode_num_draft_tokens_total") == 10
    assert value(s, "vllm:spec_decode_num_accepted_tokens_total") == 6
    assert [value(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in (0, 1)] == [4, 2]
    assert value(s, "vllm:inter_token_latency_seconds_count") == 4
    assert value(s, "vllm:request_time_per_output_token_seconds_sum") == 2.0 / 8
    per_replica = {name: [value(s, name, replica=str(i)) for i in (0, 1)] for name in (
        "hotpath:dp_requests_routed_total", "hotpath:dp_requests_prefix_routed_total",
        "hotpath:dp_requests_in_flight", "hotpath:dp_prompt_tokens_total", "hotpath:dp_replica_alive")}
    assert per_replica == {"hotpath:dp_requests_routed_total": [3, 1], "hotpath:dp_requests_prefix_routed_total": [1, 0],
                           "hotpath:dp_requests_in_flight": [0, 1], "hotpath:dp_prompt_tokens_total": [30, 12],
                           "hotpath:dp_replica_alive": [1, 0]}


def test_apps_in_one_process_keep_registries_of_their_own():
    a, b = ServerMetrics(MODEL, FakeFront(EngineStats())), ServerMetrics(MODEL, FakeFront(EngineStats()))
    a.observe_finished(finished(3, [2]))
    assert value(scrape(a.render().decode()), "vllm:time_to_first_token_seconds_count") == 1
    assert value(scrape(b.render().decode()), "vllm:time_to_first_token_seconds_count") == 0


def test_observe_repeated_equals_observing_one_at_a_time():
    registry = CollectorRegistry()
    bulk, loop = (Histogram(name, "", buckets=(0.1, 0.5, 1.0), registry=registry) for name in ("bulk", "loop"))
    for v, n in ((0.05, 3), (0.5, 7), (2.0, 2), (0.3, 1)):
        observe_repeated(bulk, v, n)
        for _ in range(n):
            loop.observe(v)
    got = {(x.name.replace("bulk", "h"), x.labels.get("le")): x.value for x in bulk.collect()[0].samples
           if not x.name.endswith("_created")}
    want = {(x.name.replace("loop", "h"), x.labels.get("le")): x.value for x in loop.collect()[0].samples
            if not x.name.endswith("_created")}
    assert got == want and got[("h_count", None)] == 13


def wait_idle(server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.gauge("vllm:num_requests_running") or server.gauge("vllm:num_requests_waiting"):
        assert time.monotonic() < deadline, "the engine stayed busy"
        time.sleep(0.05)


def test_a_real_server_counts_its_requests(server):
    """A few requests, streamed and not, move the counters by what their usage says."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    wait_idle(server)
    resp = httpx.get(server.url + "/metrics", timeout=10)  # no API key: scrapers need none
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    before = scrape(resp.text)
    params = dict(model=MODEL, temperature=0, max_tokens=6, extra_body={"ignore_eos": True})
    usages = [client.completions.create(prompt="The quick brown fox", **params).usage,
              client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **params).usage]
    for chunk in client.completions.create(prompt="Once upon a time", stream=True,
                                           stream_options={"include_usage": True}, **params):
        usage = chunk.usage or None
    usages.append(usage)
    for chunk in client.chat.completions.create(messages=[{"role": "user", "content": "Count to three"}],
                                                stream=True, stream_options={"include_usage": True}, **params):
        usage = chunk.usage or None
    usages.append(usage)
    assert all(u is not None for u in usages)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    after = scrape(text)

    def moved(name: str, **labels: str) -> float:
        key = (name, frozenset({"model_name": MODEL, **labels}.items()))
        return after[key] - before.get(key, 0.0)

    prompt, generated = sum(u.prompt_tokens for u in usages), sum(u.completion_tokens for u in usages)
    assert generated == 4 * 6
    assert moved("vllm:prompt_tokens_total") == prompt
    assert moved("vllm:generation_tokens_total") == generated
    assert moved("vllm:request_prompt_tokens_sum") == prompt and moved("vllm:request_prompt_tokens_count") == 4
    assert moved("vllm:request_generation_tokens_sum") == generated
    assert moved("vllm:time_to_first_token_seconds_count") == 4
    assert moved("vllm:time_to_first_token_seconds_sum") > 0
    assert moved("vllm:e2e_request_latency_seconds_count") == 4
    for phase in ("queue", "prefill", "decode", "inference"):  # the engine stamps when each was admitted
        assert moved(f"vllm:request_{phase}_time_seconds_count") == 4, phase
    assert moved("vllm:request_queue_time_seconds_sum") + moved("vllm:request_inference_time_seconds_sum") \
        <= moved("vllm:e2e_request_latency_seconds_sum") + 1e-6
    assert moved("vllm:request_time_per_output_token_seconds_count") == 4
    assert moved("vllm:inter_token_latency_seconds_count") == 4 * 5  # steps after each first token
    assert moved("vllm:request_success_total", finished_reason="length") == 4
    http = {route: after[("hotpath:http_requests_total", frozenset({"route": route, "status": "200"}.items()))]
            - before.get(("hotpath:http_requests_total", frozenset({"route": route, "status": "200"}.items())), 0)
            for route in ("/v1/completions", "/v1/chat/completions")}
    assert http == {"/v1/completions": 2, "/v1/chat/completions": 2}
    assert value(after, "vllm:num_requests_running") == 0 and 0 <= value(after, "vllm:kv_cache_usage_perc") <= 1
    # every vllm: series carries the served model's name
    vllm_samples = [key for key in after if key[0].startswith("vllm:")]
    assert vllm_samples and all(dict(labels).get("model_name") == MODEL for _, labels in vllm_samples)
