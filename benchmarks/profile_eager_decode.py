"""Where an eagerly run decode step's time goes (models whose steps run without a CUDA graph, or
--enforce-eager): the step's wall time, then torch.profiler's top ops by GPU time and by host
time over a few steps.

    python benchmarks/profile_eager_decode.py --preset qwen3.5-9b --out DIR
"""

import argparse
import time
from pathlib import Path

import torch

from profile_decode import decoding_engine  # benchmarks/ is on the path when run as a script


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3.5-9b")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=".")
    ns = ap.parse_args()
    engine = decoding_engine(ns.preset, ns.batch_size)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(ns.steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / ns.steps * 1e3
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(ns.steps):
            engine.step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    report = [f"{ns.preset} batch {ns.batch_size}: {step_ms:.2f} ms a step (unprofiled)",
              averages.table(sort_by="cuda_time_total", row_limit=25),
              averages.table(sort_by="self_cpu_time_total", row_limit=25)]
    text = "\n".join(report)
    print(text[:6000])
    (Path(ns.out) / f"profile_eager_{ns.preset}_bs{ns.batch_size}.txt").write_text(text)


if __name__ == "__main__":
    main()
