"""`hotpath bench serve`: load an OpenAI-compatible server and measure what its users feel.

Each request streams (SSE) with usage included, so the client sees every chunk as the server sends it:
  TTFT  time to the first chunk with text
  ITL   gaps between successive text chunks (a chunk may carry several tokens when the server coalesces)
  TPOT  (latency - TTFT) / (output tokens - 1), per request; output tokens from the server's usage
  E2E   request latency
plus requests/s and output tokens/s over the whole run. Requests start as a Poisson process at
--request-rate (all at once by default), at most --max-concurrency in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field

from hotpath.bench.datasets import BenchRequest

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)


def _payload(req: BenchRequest, model: str, ignore_eos: bool) -> tuple[str, dict]:
    body = {"model": model, "max_tokens": req.output_len, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension, which hotpath's server also reads
    if req.is_chat:
        return "/v1/chat/completions", {**body, "messages": req.messages}
    return "/v1/completions", {**body, "prompt": req.prompt}


async def _send(session, url: str, headers: dict, req: BenchRequest, model: str,
                ignore_eos: bool) -> RequestResult:
    path, body = _payload(req, model, ignore_eos)
    start = time.perf_counter()
    last = start
    result = RequestResult(ok=False)
    ttft = None
    try:
        async with session.post(url + path, json=body, headers=headers) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.read()).decode(errors='replace')[:300]}"
                return result
            async for line in resp.content:  # one SSE line at a time
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if text:
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - start
                        else:
                            result.itl.append(now - last)
                        last = now
    except Exception as e:  # a benchmark records failures and goes on
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - start
    result.ttft = ttft if ttft is not None else result.latency
    result.ok = True
    return result


async def _run(base_url: str, requests: list[BenchRequest], model: str, max_concurrency: int,
               request_rate: float, api_key: str | None, ignore_eos: bool, seed: int,
               progress: bool) -> tuple[list[RequestResult], float]:
    import aiohttp
    from tqdm import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rng = random.Random(seed)
    semaphore = asyncio.Semaphore(max_concurrency)
    connector = aiohttp.TCPConnector(limit=max_concurrency)
    # no total timeout (a long run's requests wait their turn); events up to 8 MB (logprobs chunks)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, connect=30),
                                     read_bufsize=1 << 22) as session:
        bar = tqdm(total=len(requests), desc=f"concurrency {max_concurrency}", unit="req",
                   disable=not progress, file=sys.stderr)

        async def limited(req: BenchRequest) -> RequestResult:
            async with semaphore:
                result = await _send(session, base_url, headers, req, model, ignore_eos)
            bar.update(1)
            return result

        tasks = []
        start = time.perf_counter()
        for req in requests:
            tasks.append(asyncio.create_task(limited(req)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return results, duration


def _asyncio_run(coro):
    """asyncio.run on uvloop where it is installed: the client parses as many events as the server
    sends, and must not be what limits a benchmark."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ordered = sorted(values)

    def pct(p: float) -> float:  # linear interpolation, as numpy's default
        k = (len(ordered) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {"mean": sum(values) / len(values), **{f"p{p}": pct(p) for p in PERCENTILES}}


def summarize(results: list[RequestResult], duration: float, max_concurrency: int,
              request_rate: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    errors = sorted({r.error for r in results if not r.ok})
    return {
        "max_concurrency": max_concurrency,
        "request_rate": request_rate if math.isfinite(request_rate) else "inf",
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors[:5],
        "duration_s": duration,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        # latencies in milliseconds
        "ttft_ms": _ms(_percentiles([r.ttft for r in ok])),
        "tpot_ms": _ms(_percentiles(tpot)),
        "itl_ms": _ms(_percentiles([x for r in ok for x in r.itl])),
        "e2e_ms": _ms(_percentiles([r.latency for r in ok])),
    }


def _ms(stats: dict) -> dict:
    return {k: None if v is None else v * 1000 for k, v in stats.items()}


def run_benchmark(base_url: str, requests: list[BenchRequest], model: str, max_concurrency: int,
                  request_rate: float = math.inf, api_key: str | None = None, ignore_eos: bool = True,
                  seed: int = 0, num_warmup: int = 1, progress: bool = True) -> dict:
    """One load level: warm-up requests (not measured), then every request; returns the summary."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (inf: all at once), got {request_rate}")
    base_url = base_url.rstrip("/")
    if num_warmup:
        warm, _ = _asyncio_run(_run(base_url, requests[:num_warmup], model, num_warmup, math.inf,
                                   api_key, ignore_eos, seed, progress=False))
        failed = [r.error for r in warm if not r.ok]
        if failed:
            raise RuntimeError(f"warm-up request failed: {failed[0]}")
    results, duration = _asyncio_run(_run(base_url, requests, model, max_concurrency, request_rate,
                                         api_key, ignore_eos, seed, progress))
    return summarize(results, duration, max_concurrency, request_rate)


def served_model(base_url: str, api_key: str | None) -> str:
    """The first model id the server lists at /v1/models."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/models"
    try:
        resp = httpx.get(url, headers=headers, timeout=30.0)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach the server at {url}: {e}") from None
    if resp.status_code != 200:
        raise ValueError(f"{url} answered HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()["data"][0]["id"]


def format_table(summaries: list[dict]) -> str:
    """A markdown table, one row per load level."""
    header = ("| concurrency | req/s | output tok/s | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) "
              "| ITL p50 / p90 / p99 (ms) | E2E p50 (ms) | failed |")
    rows = [header, "|---" * (header.count("|") - 1) + "|"]
    for s in summaries:
        rows.append(
            f"| {s['max_concurrency']} | {s['request_throughput']:.2f} | {s['output_throughput']:.1f} "
            f"| {_three(s['ttft_ms'])} | {_three(s['tpot_ms'])} | {_three(s['itl_ms'])} "
            f"| {_num(s['e2e_ms']['p50'])} | {s['failed']} |")
    return "\n".join(rows)


def _three(stats: dict) -> str:
    return " / ".join(_num(stats[f"p{p}"]) for p in PERCENTILES)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def results_json(summaries: list[dict], meta: dict) -> str:
    return json.dumps({**meta, "results": summaries}, indent=2)
