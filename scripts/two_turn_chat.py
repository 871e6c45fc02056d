"""A two-turn chat through `hotpath serve` whose second turn hits the prefix cache: TTFT of each
turn with prefix caching on (the default) and off, and the cache's hit rate from /metrics.

Turn 1 sends a long user message (--first-words words of text); turn 2 sends that message, the
server's reply and a short follow-up, as a chat client does. With caching on, turn 2 finds turn 1's
prompt and reply in the cache (for hybrid models: the KV blocks and the nearest state snapshot)
and prefills only the rest. Streamed with the official `openai` client over loopback.

On the GPU machine (the server's wheels and the Qwen3 tokenizer in .whl/, see .whl/README):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
      PYTHONPATH=$PWD:/tmp/site python3 scripts/two_turn_chat.py --preset qwen3.5-35b-a3b --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hotpath.bench.presets import preset_dir  # noqa: E402
from serve_vs_offline import free_port  # noqa: E402 (scripts/ is on the path when run as a script)


@contextlib.contextmanager
def server(ns: argparse.Namespace, model_dir: str, label: str, flags: list[str]) -> Iterator[str]:
    port = free_port()
    log = ns.out / f"server-{label}.log"
    cmd = [sys.executable, "-m", "hotpath.cli", "serve", "--model", model_dir, "--load-format", ns.load_format,
           "--tokenizer", ns.tokenizer, "--served-model-name", "chat", "--port", str(port), *flags]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ns.startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {ns.startup_timeout} s: {log.read_text()[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def turn(client, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    """(TTFT in seconds, the reply's text) of one streamed chat completion."""
    start = time.perf_counter()
    ttft, parts = None, []
    stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - start
            parts.append(chunk.choices[0].delta.content)
    if ttft is None:
        raise RuntimeError("the reply had no content")
    return ttft, "".join(parts)


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    if found is None:
        raise RuntimeError(f"/metrics has no {name}")
    return float(found.group(1))


def two_turns(url: str, first: str, ns: argparse.Namespace) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none")
    turn(client, [{"role": "user", "content": "warm-up " + first[:2000]}], 4)  # compile, first-use costs
    messages = [{"role": "user", "content": first}]
    ttft1, reply = turn(client, messages, ns.reply_tokens)
    messages += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "Now summarise that in one sentence."}]
    before = httpx.get(url + "/metrics").text
    ttft2, _ = turn(client, messages, ns.reply_tokens)
    after = httpx.get(url + "/metrics").text
    hits, queried = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    return {"ttft_turn1_ms": ttft1 * 1e3, "ttft_turn2_ms": ttft2 * 1e3,
            # turn 2's own lookup, from the counters' change
            "turn2_prompt_tokens_hit": metric(after, hits) - metric(before, hits),
            "turn2_prompt_tokens": metric(after, queried) - metric(before, queried),
            # since the server started (the warm-up and turn 1 included)
            "prefix_cache_hit_rate": metric(after, hits) / max(metric(after, queried), 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3.5-35b-a3b", help="model shape, random weights")
    ap.add_argument("--model", help="a checkpoint directory instead of --preset")
    ap.add_argument("--load-format", default="dummy", help="dummy (random weights) or auto")
    ap.add_argument("--tokenizer", default=str(ROOT / ".whl" / "qwen3-tokenizer"), help="tokenizer directory")
    ap.add_argument("--first-words", type=int, default=6000, help="words in the first user message")
    ap.add_argument("--reply-tokens", type=int, default=64, help="max_tokens of each reply")
    ap.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for /health")
    ap.add_argument("--out", type=Path, default=Path("."), help="directory for the JSON and server logs")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    model_dir = ns.model or str(preset_dir(ns.preset))
    rng = random.Random(0)
    words = "the of and to in is that for it as with was on be by this are from at or an not".split()
    first = " ".join(rng.choice(words + [f"w{rng.randrange(10000)}"]) for _ in range(ns.first_words))
    results = {"model": ns.model or ns.preset, "first_words": ns.first_words}
    for label, flags in (("cache", []), ("no-cache", ["--no-enable-prefix-caching"])):
        with server(ns, model_dir, label, flags) as url:
            results[label] = two_turns(url, first, ns)
        print(label, json.dumps(results[label]), flush=True)
    (ns.out / "two_turn_chat.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
