"""Decode attention at large batch (Qwen3-8B heads): achieved K/V bandwidth of the default
configuration against forced splits and tile configurations, calls captured back to back in a CUDA
graph on caches that together exceed L2. Usage: python benchmarks/decode_attention_sweep.py
[--batch 256] [--ctx 900] [--kv-dtype bf16|fp8] [--out DIR] (fp8: the caches cast to e4m3 with
unit scales)"""

import argparse
import json
import random
from pathlib import Path

import torch

from hotpath.ops.attention import triton_decode
from kernel_bench import Bench  # benchmarks/ is on the path when run as a script

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--ctx", type=int, default=900, help="mean context; contexts uniform in [ctx/2, 3ctx/2]")
ap.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16")
ap.add_argument("--out", default=".")
ns = ap.parse_args()
elem = 1 if ns.kv_dtype == "fp8" else 2
b = Bench("cuda", tiny=False)
rng = random.Random(0)
ctxs = [rng.randint(ns.ctx // 2, 3 * ns.ctx // 2) for _ in range(ns.batch)]
kv_bytes = 2 * sum(ctxs) * 8 * 128 * elem
inputs = [b.paged([1] * ns.batch, ctxs, 32, 8, 128, "nhd") for _ in range(b.copies(kv_bytes))]
if ns.kv_dtype == "fp8":
    inputs = [(a[0], a[1].to(torch.float8_e4m3fn), a[2].to(torch.float8_e4m3fn), *a[3:]) for a in inputs]
results = {}
configs = [dict()] + [dict(num_splits=s) for s in (2, 4)] + [
    dict(block_n=n, num_stages=st, num_warps=w) for n in (32, 64, 128, 256) for st in (2, 3) for w in (4, 8)]
for kw in configs:
    name = ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
    try:
        us = b.graph_us([lambda a=a: triton_decode.paged_attention(*a, **kw) for a in inputs])
    except Exception as e:  # out of shared memory, say
        print(f"{name}: failed {str(e)[:100]}")
        continue
    results[name] = {"us": us, "GBps": kv_bytes / us / 1e3}
    print(f"{name:40s} {us:8.1f} us {kv_bytes / us / 1e3:6.0f} GB/s", flush=True)
Path(ns.out, f"decode_attention_b{ns.batch}_ctx{ns.ctx}_{ns.kv_dtype}.json").write_text(json.dumps(results, indent=1))
