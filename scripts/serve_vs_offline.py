"""Serving TPOT against offline TPOT, in one run on one device.

1. `hotpath serve` with its engine in a process of its own (the default), loaded by the serving
   bench's client: N requests at concurrency N, all sent at once, streamed (a warm-up pass of other
   prompts first, so that no compilation or first-use cost lands in the measured pass).
2. The same with `--no-engine-process` (the engine on a thread of the HTTP process), unless
   `--modes process` leaves it out.
3. LLM.generate on the same prompts as one batch (tokenizer loaded, so it detokenizes as the server
   does), after a warm-up batch of the warm-up prompts.
TPOT is per request, (last token - first token) / (output tokens - 1): the bench's definition for the
servers (client-side times) and the engine's own timestamps offline. Prints a table and writes
summary.json (plus each server's log and bench JSON) under --out.

On a GPU machine without the server's packages (wheels and the Qwen3 tokenizer in .whl/, see
.whl/README):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
      PYTHONPATH=$PWD:/tmp/site python3 scripts/serve_vs_offline.py --out $OUT
A CPU smoke test with a tiny checkpoint (its own tokenizer, token ids inside its vocabulary):
    python3 scripts/serve_vs_offline.py --out /tmp/svo --model DIR --load-format auto \\
      --tokenizer DIR --device cpu --max-model-len 256 --input-len 16 --output-len 32 --concurrency 8 \\
      --token-range 10 400
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hotpath.bench.datasets import BenchRequest, load_requests  # noqa: E402
from hotpath.bench.presets import preset_dir  # noqa: E402
from hotpath.bench.serve import _ms, _percentiles, run_benchmark  # noqa: E402

MODES = {"process": [], "thread": ["--no-engine-process"]}
LABELS = {"process": "hotpath serve, engine process", "thread": "hotpath serve, engine thread (old)"}


def say(msg: str) -> None:
    print(f"[serve_vs_offline] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_flags(ns: argparse.Namespace, model_dir: str) -> list[str]:
    flags = ["--model", model_dir, "--load-format", ns.load_format, "--tokenizer", ns.tokenizer,
             "--device", ns.device]
    return flags + (["--max-model-len", str(ns.max_model_len)] if ns.max_model_len else [])


def run_server(ns: argparse.Namespace, mode: str, model_dir: str, warmup: list[BenchRequest],
               measured: list[BenchRequest]) -> dict:
    port = free_port()
    log = ns.out / f"server-{mode}.log"
    cmd = [sys.executable, "-m", "hotpath.cli", "serve", *engine_flags(ns, model_dir), "--port", str(port),
           "--served-model-name", "bench", *MODES[mode]]
    say(f"{mode}: {' '.join(cmd)}")
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + ns.startup_timeout
        while proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                return {"error": f"not healthy after {ns.startup_timeout}s", "log_tail": log.read_text()[-3000:]}
            time.sleep(1)
        else:
            return {"error": f"server exited with {proc.returncode}", "log_tail": log.read_text()[-3000:]}
        say(f"{mode}: up; warm-up pass")
        run_benchmark(url, warmup, "bench", ns.concurrency, num_warmup=0, progress=False)
        say(f"{mode}: measured pass")
        summary = run_benchmark(url, measured, "bench", ns.concurrency, num_warmup=0, progress=False)
        (ns.out / f"serve-{mode}.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        say(f"{mode}: server exit code {proc.returncode}")


def run_offline(ns: argparse.Namespace, model_dir: str, warmup: list[BenchRequest],
                measured: list[BenchRequest]) -> dict:
    from hotpath import LLM, SamplingParams

    llm = LLM(model_dir, tokenizer=ns.tokenizer, load_format=ns.load_format, device=ns.device,
              max_model_len=ns.max_model_len)
    params = SamplingParams(temperature=0, max_tokens=ns.output_len, ignore_eos=True)
    say("offline: warm-up batch")
    llm.generate([{"prompt_token_ids": r.prompt} for r in warmup], params, use_tqdm=False)
    say(f"offline: measured batch of {len(measured)}")
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": r.prompt} for r in measured], params, use_tqdm=False)
    wall = time.perf_counter() - start
    tpot, ttft = [], []
    for out in outs:
        m, n = out.metrics, len(out.outputs[0].token_ids)
        ttft.append(m["first_token_time"] - m["arrival_time"])
        if n > 1:
            tpot.append((m["finished_time"] - m["first_token_time"]) / (n - 1))
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    # the bench's percentiles, so that the rows compare
    return {"completed": len(outs), "output_tokens": tokens, "duration_s": wall,
            "output_throughput": tokens / wall, "tpot_ms": _ms(_percentiles(tpot)),
            "ttft_ms": _ms(_percentiles(ttft))}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for summary.json, logs, bench JSON")
    p.add_argument("--preset", default="qwen3-8b", help="model shape with --load-format dummy (default qwen3-8b)")
    p.add_argument("--model", default=None, help="a model directory instead of the preset")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tokenizer", default=str(ROOT / ".whl" / "qwen3-tokenizer"))
    p.add_argument("--device", default="auto")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's, as a user gets it")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=64, help="requests, all in flight at once (default 64)")
    p.add_argument("--token-range", type=int, nargs=2, default=[1000, 20000])
    p.add_argument("--modes", default="process,thread", help="servers to run: process, thread or both")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    ns = p.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    model_dir = ns.model or str(preset_dir(ns.preset))

    def prompts(seed: int) -> list[BenchRequest]:
        return load_requests("random", ns.concurrency, ns.output_len, seed=seed, input_len=ns.input_len,
                             token_range=tuple(ns.token_range))

    # distinct warm-up prompts, so that the measured pass finds nothing in the prefix cache
    warmup, measured = prompts(1), prompts(0)
    results = {mode: run_server(ns, mode, model_dir, warmup, measured) for mode in ns.modes.split(",")}
    results["offline"] = run_offline(ns, model_dir, warmup, measured)

    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
               "torch": torch.__version__, "model": ns.model or ns.preset,
               "load_format": ns.load_format, "input_len": ns.input_len, "output_len": ns.output_len,
               "concurrency": ns.concurrency, "results": results}
    (ns.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    print(f"\n{device}, {summary['model']} ({ns.load_format}), {ns.concurrency} requests at once, "
          f"{ns.input_len} in / {ns.output_len} out\n")
    print("| run | TPOT p50 / mean (ms) | ITL p50 (ms) | TTFT p50 (ms) | output tok/s | failed |")
    print("|---|---|---|---|---|---|")
    for key, r in results.items():
        label = LABELS.get(key, f"LLM.generate, batch {ns.concurrency}")
        if "error" in r:
            print(f"| {label} | {r['error']} | | | | |")
            continue
        itl = r.get("itl_ms", {}).get("p50")
        print(f"| {label} | {_fmt(r['tpot_ms']['p50'])} / {_fmt(r['tpot_ms']['mean'])} | {_fmt(itl)} | "
              f"{_fmt(r['ttft_ms']['p50'])} | {r['output_throughput']:.1f} | {r.get('failed', 0)} |")
    print(f"\nwrote {ns.out / 'summary.json'}")
    return 1 if any("error" in r or r.get("failed") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
