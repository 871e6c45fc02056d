"""GEMV tile sweep at M = 1 on the GPU (PDL on by default), Qwen3-0.6B and -8B projections: each
configuration timed in a CUDA graph of back-to-back calls over distinct weights (over the L2),
checked against torch first; gate_up runs fused with SiLU-and-mul, as decode does.

    python scripts/gemv_sweep.py   # OUT=dir for gemv_sweep.json
"""
import json
import math
import os

import torch
import torch.nn.functional as F

from hotpath.ops.bench_kernels import Bench
from hotpath.ops.linear import triton_gemv as g
from hotpath.ops.linear.bench import Variant, config_for

b = Bench("cuda", False)
dt = torch.bfloat16
SH = {"8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (24576, 4096), "8b down": (4096, 12288),
      "06b qkv": (4096, 1024), "06b o": (1024, 2048), "06b gate_up": (6144, 1024), "06b down": (1024, 3072)}
V = [Variant("ew8x1024", 8, 1024, 4, 1, False), Variant("ew8x1024 nosplit", 8, 1024, 4, 1, False, 0),
     Variant("ew8x1024 pps8", 8, 1024, 4, 1, False, 8), Variant("ew8x1024 pps16", 8, 1024, 4, 1, False, 16),
     Variant("ew4x1024", 4, 1024, 4, 1, False), Variant("ew8x512", 8, 512, 4, 1, False),
     Variant("ew16x512", 16, 512, 4, 1, False), Variant("ew8x2048 w8", 8, 2048, 8, 1, False),
     Variant("ew16x1024 w8", 16, 1024, 8, 1, False),
     Variant("dot16x512 s4", 16, 512, 4, 4, True), Variant("dot32x256 s4", 32, 256, 4, 4, True),
     Variant("dot32x256 s6", 32, 256, 4, 6, True), Variant("dot64x128 s6", 64, 128, 4, 6, True),
     Variant("dot16x256 s8", 16, 256, 4, 8, True), Variant("dot32x512 s3 w8", 32, 512, 8, 3, True)]
res = {}
for name, (N, K) in SH.items():
    nb = N * K * 2
    ws = [torch.randn(N, K, device="cuda", dtype=dt) for _ in range(max(2, min(64, math.ceil(256 * 2**20 / nb))))]
    x = torch.randn(1, K, device="cuda", dtype=dt)
    want = F.linear(x, ws[0]).float()
    gated = "gate_up" in name
    op = g.linear_silu_and_mul if gated else g.linear
    r = {"default": b.graph_us([lambda w=w: op(x, w) for w in ws])}
    for v in V:
        try:
            cfg = config_for(v, N, K, ws[0].device)
            if not gated:
                out = g.linear(x, ws[0], config=cfg).float()
                if not float((out - want).norm() / want.norm()) < 2e-2:
                    r[v.name] = "wrong"; continue
            r[v.name] = b.graph_us([lambda w=w, cfg=cfg: op(x, w, config=cfg) for w in ws])
        except Exception as e:
            r[v.name] = repr(e)[:80]
    res[name] = r
    best = min((k for k in r if isinstance(r[k], float)), key=lambda k: r[k])
    print(f"{name:11s} {nb/1e6:6.1f}MB best {best} {r[best]:.1f}us {nb/r[best]/1e6:.2f}TB/s | " +
          " ".join(f"{k}:{v:.1f}" if isinstance(v, float) else f"{k}:{v}" for k, v in r.items()), flush=True)
    del ws
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gemv_sweep.json"), "w"), indent=1)
