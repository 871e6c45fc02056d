"""/metrics through prometheus_client, with vLLM's (v1) metric names where vLLM has the metric.

Two sources, one registry per app (a `CollectorRegistry` of its own, not prometheus_client's
process-global one, so several servers can live in one process, as they do in the tests):

- **The engine's counters and gauges** (running / waiting requests, KV cache usage, prefix cache,
  preemptions, prompt and generated tokens, steps, aborts, speculative decoding's drafts) are
  counted where the engine runs, in the engine process (or the engine thread with
  `--no-engine-process`), and reach this process as the `EngineStats` snapshot that comes with
  every engine step (summed over data-parallel replicas by the front). `EngineCollector.collect()`
  reads that snapshot when /metrics is scraped, so the engine process owns its counters and
  nothing in it touches prometheus_client: no PROMETHEUS_MULTIPROC_DIR, no mmap'd files to share
  or clean up, and a restarted engine cannot leave stale series behind. This is how prometheus_client
  is multi-process safe here: one process exposes, the other reports.
- **Per-request histograms and the HTTP / finish-reason counters** are observed in this (the API)
  process with prometheus_client's `Histogram` and `Counter`: the engine front calls
  `observe_finished` with each finished request's final output (its `metrics`: arrival, first
  token and finish times), and the ASGI guard calls `count_http`.

Names: `vllm:` and the `model_name` label where vLLM v1 has the metric (so its dashboards and
alerts work unchanged), with its bucket boundaries; `hotpath:` for what vLLM does not have (engine
steps, aborted requests, HTTP responses by route and status, the data-parallel per-replica
series). `vllm:request_queue_time_seconds` is not exposed: a RequestOutput's metrics carry no
"first scheduled" time to measure the queue from.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hotpath.engine.front import EngineFront
from hotpath.outputs import RequestOutput

# The text format /metrics has always answered in (every name here is a legacy one, so the
# 1.0.0 format would print the same).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM v1's bucket boundaries (vllm/v1/metrics/loggers.py), so quantiles compare across servers.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: vLLM's token-count buckets (max_model_len)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class EngineCollector:
    """The engine's counters and gauges, read from the front's latest snapshot at scrape time."""

    def __init__(self, front: EngineFront, model_name: str) -> None:
        self.front = front
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self.front.stats  # one snapshot (EngineClient swaps it whole each step)
        labels = ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    stats.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    stats.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    stats.kv_cache_usage)
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.",
                      stats.prefix_queried_tokens)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      stats.prefix_hit_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      stats.num_preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      stats.generation_tokens)
        if stats.spec_accepted_per_pos:  # one entry per draft position with speculative decoding, else none
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats.spec_num_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                          stats.spec_num_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                          stats.spec_num_accepted_tokens)
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Accepted tokens per draft position.", labels=["model_name", "position"])
            for i, n in enumerate(stats.spec_accepted_per_pos):
                per_pos.add_metric([self.model_name, str(i)], n)
            yield per_pos
        yield counter("hotpath:engine_steps", "Engine steps run.", stats.num_steps)
        yield counter("hotpath:request_aborted",
                      "Requests aborted before they finished (client gone, shutdown).", stats.num_aborted)

        replicas = self.front.replicas()
        if replicas:
            per_replica = [
                ("hotpath:dp_requests_routed", CounterMetricFamily, "Requests the router sent to each replica.",
                 lambda r: r.routed),
                ("hotpath:dp_requests_prefix_routed", CounterMetricFamily,
                 "Requests sent to a replica for a prefix of their prompt it was sent before.",
                 lambda r: r.prefix_routed),
                ("hotpath:dp_requests_in_flight", GaugeMetricFamily,
                 "Requests sent to each replica and not finished.", lambda r: r.in_flight),
                ("hotpath:dp_prompt_tokens", CounterMetricFamily, "Prompt tokens each replica's engine accepted.",
                 lambda r: r.stats.prompt_tokens),
                ("hotpath:dp_replica_alive", GaugeMetricFamily,
                 "1 while the replica's engine process serves, else 0.", lambda r: int(r.alive)),
            ]
            for name, family_cls, doc, value in per_replica:
                family = family_cls(name, doc, labels=["model_name", "replica"])
                for i, r in enumerate(replicas):
                    family.add_metric([self.model_name, str(i)], value(r))
                yield family


class ServerMetrics:
    """One app's /metrics: its registry, the engine collector on `front`, the request histograms
    (fed by the front's FinishedHook) and the HTTP counts (fed by the ASGI guard)."""

    def __init__(self, model_name: str, front: EngineFront) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(front, model_name))
        labels, reg = ["model_name"], self.registry

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg).labels(model_name)

        token_buckets = buckets_1_2_5(front.info.max_model_len)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                    token_buckets)
        self.generation_len = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                        token_buckets)
        # a request's phases, as vLLM splits them: waiting, prefill (to the first token), decode
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                ["model_name", "finished_reason"], registry=reg)
        for reason in ("stop", "length"):  # present from the start, as vLLM's are
            self._success.labels(model_name, reason)
        self._http = Counter("hotpath:http_requests", "HTTP responses, by route and status code.",
                             ["route", "status"], registry=reg)

    def observe_finished(self, out: RequestOutput) -> None:
        """The engine front's FinishedHook: one finished request, once.

        Latencies are the request's (its longest sequence's, with n > 1), from the engine's
        arrival, first-token and finish times. vLLM observes one inter-token latency per engine
        step; only the request's totals reach this process, so each of its decode steps is
        observed at the request's mean interval: the histogram's sum and count are vLLM's, its
        buckets are per-request means."""
        m = out.metrics
        arrival, first, done = m.get("arrival_time"), m.get("first_token_time"), m.get("finished_time")
        longest = max((len(o.token_ids) for o in out.outputs), default=0)
        if arrival is not None and first is not None:
            self.ttft.observe(first - arrival)
            if done is not None and longest > 1:
                decode = done - first
                self.tpot.observe(decode / (longest - 1))
                # steps after the first token: a verify step emits its accepted drafts too
                accepted = m.get("spec_num_accepted_tokens", 0) / max(len(out.outputs), 1)
                steps = max(round(longest - 1 - accepted), 1)
                observe_repeated(self.itl, decode / steps, steps)
        if arrival is not None and done is not None:
            self.e2e.observe(done - arrival)
        scheduled = m.get("first_scheduled_time")
        if scheduled is not None:
            if arrival is not None:
                self.queue_time.observe(max(scheduled - arrival, 0.0))
            if first is not None:
                self.prefill_time.observe(first - scheduled)
            if done is not None:
                self.inference_time.observe(done - scheduled)
        if first is not None and done is not None:
            self.decode_time.observe(done - first)
        self.prompt_len.observe(len(out.prompt_token_ids))
        self.generation_len.observe(sum(len(o.token_ids) for o in out.outputs))
        for o in out.outputs:  # per sequence: vLLM v1 runs a request's n samples as n requests
            self._success.labels(self.model_name, o.finish_reason or "unknown").inc()

    def count_http(self, route: str, status: int) -> None:
        self._http.labels(route, str(status)).inc()

    def render(self) -> bytes:
        """The exposition text, in CONTENT_TYPE."""
        return generate_latest(self.registry)


def observe_repeated(histogram: Histogram, value: float, times: int) -> None:
    """`histogram.observe(value)` `times` times, as one update where prometheus_client's child
    has the fields its `observe` updates (a request's hundreds of decode steps would otherwise
    cost ~3 us each on the event loop); a loop of observe() otherwise."""
    buckets, bounds, total = (getattr(histogram, a, None) for a in ("_buckets", "_upper_bounds", "_sum"))
    if buckets is None or bounds is None or total is None or times == 1:
        for _ in range(times):
            histogram.observe(value)
        return
    total.inc(value * times)
    for bucket, bound in zip(buckets, bounds):
        if value <= bound:
            bucket.inc(times)
            break
