"""CPU time per streamed output token of each process behind `hotpath serve`: the API process (HTTP,
SSE, the pipe's reading end), the engine process, and the benchmark client.

At 10K output tokens/s (ShareGPT on one H200) every microsecond per token in one process is 1% of a
core; a process past 100 us/token cannot keep up and the server falls behind the engine. The figure
does not depend on how fast the engine is (the CPU engine of a tiny model serves here as well as a
GPU one), so it can be measured and tuned without a GPU; wall-clock throughput can not.

    python benchmarks/serve_cpu_cost.py --model DIR [--tokenizer T] [--dataset sharegpt]
        [--num-prompts 200] [--output-len 128] [--profile OUTDIR] [--server-tree DIR]
        [-- extra `hotpath serve` flags]

--profile records py-spy (raw, collapsed stacks) of the API process and the client into OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(p) for p in text]
    return out


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--dataset", default="sharegpt")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--input-len", type=int, default=16, help="random dataset: prompt tokens")
    p.add_argument("--token-range", type=int, nargs=2, default=[3, 500], help="random dataset: token ids")
    p.add_argument("--port", type=int, default=8019)
    p.add_argument("--profile", help="folder for py-spy's raw stacks of the API process and the client")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--server-tree", help="run the server from this source tree (a `git archive` of "
                                         "another commit), the client from this one")
    ns = p.parse_args(argv)

    from hotpath.bench.datasets import load_requests
    from hotpath.bench.serve import run_benchmark, served_model

    cmd = [sys.executable, "-m", "hotpath.cli", "serve", "--model", ns.model, "--port", str(ns.port),
           "--disable-uvicorn-access-log", *extra]
    if ns.tokenizer:
        cmd += ["--tokenizer", ns.tokenizer]
    env = None
    if ns.server_tree:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(ns.server_tree)}
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              cwd=ns.server_tree, env=env)
    base = f"http://127.0.0.1:{ns.port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"the server exited: {server.stderr.read()[-2000:]}") from None
                time.sleep(0.5)
        requests = load_requests(ns.dataset, ns.num_prompts, ns.output_len, input_len=ns.input_len,
                                 token_range=tuple(ns.token_range))
        # the warm-up first, so that neither its tokens nor the server's start count
        model = served_model(base, None)
        run_benchmark(base, requests[:4], model, 4, num_warmup=0, progress=False)
        engine = children(server.pid)
        pids = {"api": server.pid, **{f"engine{i}": c for i, c in enumerate(engine)}}
        before = {k: cpu_seconds(v) for k, v in pids.items()}
        client_before = resource.getrusage(resource.RUSAGE_SELF)
        spies = []
        if ns.profile:
            Path(ns.profile).mkdir(parents=True, exist_ok=True)
            spy = shutil.which("py-spy") or "py-spy"
            for name, pid in (("api", server.pid), ("client", os.getpid())):
                spies.append(subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-f", "raw", "-r", "250", "--nonblocking",
                     "-o", f"{ns.profile}/{name}.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        start = time.perf_counter()
        summary = run_benchmark(base, requests, model, ns.num_prompts, num_warmup=0, progress=False)
        wall = time.perf_counter() - start
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        client_after = resource.getrusage(resource.RUSAGE_SELF)
        after = {k: cpu_seconds(v) for k, v in pids.items()}
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    tokens = summary["output_tokens"]
    cost = {k: (after[k] - before[k]) / tokens * 1e6 for k in pids}
    cost["client"] = ((client_after.ru_utime + client_after.ru_stime)
                      - (client_before.ru_utime + client_before.ru_stime)) / tokens * 1e6
    result = {"dataset": ns.dataset, "num_prompts": ns.num_prompts, "output_tokens": tokens,
              "failed": summary["failed"], "wall_s": wall, "cpu_us_per_token": cost,
              "server_flags": extra, "server_tree": ns.server_tree}
    print(json.dumps(result, indent=1))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
