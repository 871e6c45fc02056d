"""A/B of two GEMV kernel versions on the GPU, in CUDA graphs of back-to-back calls over distinct
weights: an older triton_gemv.py (copied as old_gemv.py into the directory OLD), the current one
with PDL off and on, and gate_up fused with SiLU-and-mul against the two ops; then whole layers
(qkv, o, gate_up, down) of Qwen3-8B and -0.6B back to back.

    git show <commit>:hotpath/ops/linear/triton_gemv.py > /tmp/old/old_gemv.py
    OLD=/tmp/old python scripts/gemv_ab.py
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from hotpath.ops.bench_kernels import Bench
from hotpath.ops import triton_utils
from hotpath.ops.linear import triton_gemv as new
from hotpath.ops.activation import triton as act
sys.path.insert(0, os.environ["OLD"])
import old_gemv as old

def set_pdl(on):
    os.environ["HOTPATH_PDL"] = "1" if on else "0"; triton_utils._pdl.clear()

b = Bench("cuda", False)
dt = torch.bfloat16
SH = {"8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (24576, 4096), "8b down": (4096, 12288),
      "8b lm": (151936, 4096), "06b qkv": (4096, 1024), "06b o": (1024, 2048), "06b gate_up": (6144, 1024), "06b down": (1024, 3072)}
res = {}
for name, (N, K) in SH.items():
    nb = N * K * 2
    ws = [torch.randn(N, K, device="cuda", dtype=dt) for _ in range(max(2, min(64, math.ceil(256 * 2**20 / nb))))]
    x = torch.randn(1, K, device="cuda", dtype=dt)
    r = {}
    r["old"] = b.graph_us([lambda w=w: old.linear(x, w) for w in ws])
    for pdl in (0, 1):
        set_pdl(pdl)
        r[f"new_pdl{pdl}"] = b.graph_us([lambda w=w: new.linear(x, w) for w in ws])
        if "gate_up" in name:
            r[f"gated_pdl{pdl}"] = b.graph_us([lambda w=w: new.linear_silu_and_mul(x, w) for w in ws])
            r[f"lin+silu_pdl{pdl}"] = b.graph_us([lambda w=w: act.silu_and_mul(new.linear(x, w)) for w in ws])
    r["old+silu"] = b.graph_us([lambda w=w: act.silu_and_mul(old.linear(x, w)) for w in ws]) if "gate_up" in name else None
    r["torch"] = b.graph_us([lambda w=w: F.linear(x, w) for w in ws])
    res[name] = r
    print(f"{name:12s} {nb/1e6:7.1f}MB " + " ".join(f"{k} {v:.1f}" for k, v in r.items() if v), flush=True)
    del ws
# whole layers back to back: qkv, o, gate_up(+silu), down over 8 distinct layers
for model, key in (("8b", "8b"), ("06b", "06b")):
    shapes = [SH[f"{key} {p}"] for p in ("qkv", "o", "gate_up", "down")]
    L = 8 if model == "8b" else 24
    layers = [[torch.randn(N, K, device="cuda", dtype=dt) for N, K in shapes] for _ in range(L)]
    xs = [torch.randn(1, K, device="cuda", dtype=dt) for N, K in shapes]
    def run_old(ws):
        old.linear(xs[0], ws[0]); old.linear(xs[1], ws[1]); act.silu_and_mul(old.linear(xs[2], ws[2])); old.linear(xs[3], ws[3])
    def run_new(ws):
        new.linear(xs[0], ws[0]); new.linear(xs[1], ws[1]); new.linear_silu_and_mul(xs[2], ws[2]); new.linear(xs[3], ws[3])
    r = {"old": b.graph_us([lambda ws=ws: run_old(ws) for ws in layers])}
    for pdl in (0, 1):
        set_pdl(pdl); r[f"new_pdl{pdl}"] = b.graph_us([lambda ws=ws: run_new(ws) for ws in layers])
    nb = sum(N * K * 2 for N, K in shapes)
    print(f"layer {model} {nb/1e6:.1f}MB per layer: " + " ".join(f"{k} {v:.1f}us ({nb/v/1e6:.2f}TB/s)" for k, v in r.items()), flush=True)
    res[f"layer {model}"] = r
    del layers
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gemv_ab.json"), "w"), indent=1)
