"""/metrics in the Prometheus text exposition format (version 0.0.4), written by hand.

Why not prometheus_client: the engine's gauges (running / waiting requests, KV usage, prefix-cache
counters) already live in EngineStats and only need printing at scrape time; the rest is three
histograms and a few counters. prometheus_client would add a dependency, a process-global registry
(awkward with several servers in one test process) and collector classes to wrap these values, for
about the same amount of code as printing them.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from hotpath.engine.front import EngineStats, ReplicaStats
from hotpath.outputs import RequestOutput

# Bucket upper bounds in seconds: from GPU decode steps (ms) to CPU requests (minutes).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0)

PREFIX = "hotpath_"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.bounds, self.counts):
            cumulative += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.sum}")
        lines.append(f"{name}_count {self.count}")
        return lines


class ServerMetrics:
    """Per-request latencies (fed by the engine front) and HTTP counts (fed from handlers)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.finished: dict[str, int] = {}  # finish reason -> requests
        self.http: dict[tuple[str, int], int] = {}  # (route, status) -> responses

    def observe_finished(self, out: RequestOutput) -> None:
        """The engine front's FinishedHook: one finished request's latencies."""
        m = out.metrics
        arrival, first, done = m.get("arrival_time"), m.get("first_token_time"), m.get("finished_time")
        num_tokens = max((len(o.token_ids) for o in out.outputs), default=0)
        with self._lock:
            if first is not None:
                self.ttft.observe(first - arrival)
                if done is not None and num_tokens > 1:
                    self.tpot.observe((done - first) / (num_tokens - 1))
            if done is not None:
                self.e2e.observe(done - arrival)
            for o in out.outputs:
                reason = o.finish_reason or "unknown"
                self.finished[reason] = self.finished.get(reason, 0) + 1

    def count_http(self, route: str, status: int) -> None:
        with self._lock:
            key = (route, status)
            self.http[key] = self.http.get(key, 0) + 1

    def render(self, stats: EngineStats, replicas: Sequence[ReplicaStats] = ()) -> str:
        """The exposition text; `stats` are the engine's (summed over data-parallel replicas), and
        `replicas` add a series per replica for what the router sent each."""
        label = f'model_name="{_escape(self.model_name)}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float, labels: str = label) -> None:
            lines.extend([f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}",
                          f"{PREFIX}{name}{{{labels}}} {value}"])

        metric("num_requests_running", "gauge", "Requests with sequences in the running batch.",
               stats.num_running)
        metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", stats.num_waiting)
        metric("kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use (0 to 1).",
               stats.kv_cache_usage)
        metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               stats.prefix_queried_tokens)
        metric("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
               stats.prefix_hit_tokens)
        hit_rate = stats.prefix_hit_tokens / stats.prefix_queried_tokens if stats.prefix_queried_tokens else 0.0
        metric("prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries, in tokens, since start.",
               hit_rate)
        metric("num_preemptions_total", "counter", "Sequences preempted for lack of KV cache blocks.",
               stats.num_preemptions)
        metric("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", stats.prompt_tokens)
        metric("generation_tokens_total", "counter", "Generated tokens.", stats.generation_tokens)
        metric("engine_steps_total", "counter", "Engine steps run.", stats.num_steps)
        metric("spec_decode_num_drafts_total", "counter",
               "Speculative decoding: verify rows (a sequence's drafts checked in one step).",
               stats.spec_num_drafts)
        metric("spec_decode_num_draft_tokens_total", "counter", "Speculative decoding: drafts proposed.",
               stats.spec_num_draft_tokens)
        metric("spec_decode_num_accepted_tokens_total", "counter",
               "Speculative decoding: drafts accepted.", stats.spec_num_accepted_tokens)
        if stats.spec_accepted_per_pos:
            name = f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Speculative decoding: drafts accepted, by draft position (0 = first).",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{{{label},position="{i}"}} {n}' for i, n in enumerate(stats.spec_accepted_per_pos)]
        if replicas:
            per_replica = [
                ("dp_requests_routed_total", "counter", "Requests the router sent to each replica.",
                 lambda r: r.routed),
                ("dp_requests_prefix_routed_total", "counter",
                 "Requests sent to a replica for a prefix of their prompt it was sent before.",
                 lambda r: r.prefix_routed),
                ("dp_requests_in_flight", "gauge", "Requests sent to each replica and not finished.",
                 lambda r: r.in_flight),
                ("dp_prompt_tokens_total", "counter", "Prompt tokens each replica's engine accepted.",
                 lambda r: r.stats.prompt_tokens),
                ("dp_replica_alive", "gauge", "1 while the replica's engine process serves, else 0.",
                 lambda r: int(r.alive)),
            ]
            for name, kind, help_text, value in per_replica:
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
                lines += [f'{PREFIX}{name}{{{label},replica="{i}"}} {value(r)}' for i, r in enumerate(replicas)]
        with self._lock:
            name = f"{PREFIX}request_success_total"
            lines += [f"# HELP {name} Finished sequences (n per request), by finish reason.",
                      f"# TYPE {name} counter"]
            for reason in sorted(set(self.finished) | {"stop", "length"}):
                lines.append(f'{name}{{{label},finished_reason="{reason}"}} {self.finished.get(reason, 0)}')
            name = f"{PREFIX}request_aborted_total"
            lines += [f"# HELP {name} Requests aborted before they finished (client gone, shutdown).",
                      f"# TYPE {name} counter", f"{name}{{{label}}} {stats.num_aborted}"]
            name = f"{PREFIX}http_requests_total"
            lines += [f"# HELP {name} HTTP responses, by route and status code.", f"# TYPE {name} counter"]
            for (route, status), n in sorted(self.http.items()):
                lines.append(f'{name}{{route="{_escape(route)}",status="{status}"}} {n}')
            lines += self.ttft.render(f"{PREFIX}time_to_first_token_seconds",
                                      "Time from arrival to the first generated token.")
            lines += self.tpot.render(f"{PREFIX}time_per_output_token_seconds",
                                      "Mean time per output token after the first, per request.")
            lines += self.e2e.render(f"{PREFIX}e2e_request_latency_seconds",
                                     "Time from arrival to the last generated token.")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
