"""Where a mixed workload's steps spend their time: the bench throughput workload (Qwen3-8B shape,
random weights, user defaults) driven step by step; a window of steady-state steps is timed by
kind (wall time between synchronised step boundaries) and profiled with torch.profiler.
Usage: python benchmarks/profile_mixed_steps.py [--preset P] [--out DIR]"""

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir
from hotpath.bench.throughput import random_workload

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="qwen3-8b")
ap.add_argument("--out", default=".")
ap.add_argument("--start", type=int, default=300, help="first profiled step")
ap.add_argument("--steps", type=int, default=60, help="steps timed and profiled")
ns = ap.parse_args()

llm = LLM(str(preset_dir(ns.preset)), load_format="dummy", skip_tokenizer_init=True)
engine, runner = llm.engine, llm.engine.executor.runner
work = random_workload(1024, (128, 1024), (128, 512), engine.model_config.vocab_size, 0)
for i, (p, m) in enumerate(work[:64]):  # warm-up
    engine.add_request(f"w{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
for i, (p, m) in enumerate(work):
    engine.add_request(f"r{i}", {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))

kinds: list[str] = []
launch = runner.launch


def tagged_launch(scheduled, *args, **kwargs):
    decodes = sum(1 for s, n in scheduled if n == 1 and s.num_computed_tokens + 1 == s.num_tokens)
    kind = ("graph" if runner._graph_size(scheduled) else "eager") if decodes == len(scheduled) else (
        "mixed" if decodes else "prefill")
    kinds.append(f"{kind}:{len(scheduled)}:{sum(n for _, n in scheduled) - decodes}")
    return launch(scheduled, *args, **kwargs)


runner.launch = tagged_launch
step = 0
while step < ns.start:
    engine.step()
    step += 1
times = defaultdict(list)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(ns.steps):
        torch.cuda.synchronize()
        n = len(kinds)
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        kind = kinds[n].split(":")[0] if len(kinds) > n else "none"
        times[kind].append(dt)
print("per-step wall time by kind (synchronised):")
summary = {k: {"steps": len(v), "mean_ms": statistics.mean(v) * 1e3, "median_ms": statistics.median(v) * 1e3}
           for k, v in times.items()}
for k, v in summary.items():
    print(f"  {k:8s} {v['steps']:3d} steps  mean {v['mean_ms']:.1f} ms  median {v['median_ms']:.1f} ms")
print("step kinds (kind:rows:prefill tokens):", " ".join(kinds[-ns.steps:]))
table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
print(table)
cpu_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
print(cpu_table)
out = Path(ns.out)
out.mkdir(parents=True, exist_ok=True)
(out / f"profile_mixed_{ns.preset}.txt").write_text(table + "\n" + cpu_table)
(out / f"profile_mixed_{ns.preset}.json").write_text(json.dumps({"summary": summary, "kinds": kinds[-ns.steps:]}, indent=1))
