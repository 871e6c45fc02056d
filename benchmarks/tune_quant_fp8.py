"""Candidate tiles of the fp8 linear kernels at Qwen3-8B's projection shapes, timed on one GPU, to
pick hotpath.ops.quant's config rules: the weight-only GEMV (triton_gemv, 1-2 rows) and the fp8 x
fp8 GEMM (triton_gemm, with the activation quantization it needs), for per-channel (PTPC) and
128x128-block weights. (Run S also timed a weight-only tensor-core GEMV at 32 rows, since
removed: 43 us against the GEMM's 32 for gate_up.) Each candidate is
checked against the reference first; times are medians of CUDA-graph replays (20 calls a graph,
Bench.graph_us).

    python benchmarks/tune_quant_fp8.py --out $OUT     # writes $OUT/tune_quant_fp8.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import triton

from kernel_bench import Bench  # benchmarks/ is on the path when run as a script
from hotpath.ops.quant import reference, triton_gemm, triton_gemv
from hotpath.ops.quant.reference import FP8_GEMV_MAX_ROWS
from hotpath.ops.quant.triton_gemm import GemmConfig
from hotpath.ops.quant.triton_gemv import QuantGemvConfig

# qkv and o have gate_up's K: the two shapes below span the rules' cases
SHAPES = {"gate_up": (24576, 4096), "down": (4096, 12288)}
BLOCK = (128, 128)


def weights(N: int, K: int) -> dict[str, tuple]:
    g = torch.Generator("cuda").manual_seed(N + K)
    w = torch.randn(N, K, generator=g, device="cuda") / K**0.5
    fmax = 448.0
    ch = w.abs().amax(1).clamp_min(1e-8) / fmax  # [N]
    blk = w.view(N // 128, 128, K // 128, 128).abs().amax((1, 3)).clamp_min(1e-8) / fmax
    w_bl = (w / blk.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    return {"channel": ((w / ch[:, None]).to(torch.float8_e4m3fn), ch, None),
            "block": (w_bl, blk, BLOCK)}


def gemv_candidates() -> list[QuantGemvConfig]:
    return [QuantGemvConfig(bn, bk, nw) for bn, bk, nw in itertools.product((8, 16, 32), (2048, 4096), (4, 8))]


def gemm_candidates(M: int) -> list[GemmConfig]:
    if M >= 1024:
        return [GemmConfig(128, bn, 128, 8, 8, st) for bn, st in itertools.product((128, 256), (3, 4))]
    return [GemmConfig(bm, bn, 128, 8, 4, st) for bm, bn, st in
            itertools.product((16, 32), (64, 128), (4, 5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 8192])
    args = parser.parse_args()
    bench = Bench("cuda", tiny=False)
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "cases": []}
    for (name, (N, K)), M in itertools.product(SHAPES.items(), args.rows):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for fmt, (w, s, bs) in weights(N, K).items():
            nbytes = w.numel() + s.numel() * 4
            want = reference.fp8_linear(x, w, s, bs).float()
            kinds = []
            if M <= FP8_GEMV_MAX_ROWS:
                kinds += [("gemv", c, lambda c=c: triton_gemv.fp8_linear(x, w, s, bs, config=c))
                          for c in gemv_candidates()]
            else:
                kinds += [("gemm", c, lambda c=c: triton_gemm.fp8_linear(x, w, s, bs, config=c))
                          for c in gemm_candidates(M)]
            best = {}
            for kind, cfg, fn in kinds:
                try:
                    got = fn().float()
                except Exception as e:  # a config the kernel rejects (e.g. out of resources)
                    print(f"skip {kind} {cfg}: {type(e).__name__}")
                    continue
                err = float((got - want).norm() / want.norm())
                if err > 3e-2:
                    print(f"WRONG {name} {fmt} M={M} {kind} {cfg}: rel err {err:.1e}")
                    continue
                us = bench.graph_us([fn] * 20) if M <= 64 else triton.testing.do_bench(
                    fn, warmup=10, rep=100, return_mode="median") * 1e3
                case = dict(proj=name, N=N, K=K, M=M, format=fmt, kind=kind, config=cfg.__dict__,
                            us=us, GBps=nbytes / us / 1e3, TFLOPs=2 * M * N * K / us / 1e6)
                res["cases"].append(case)
                if kind not in best or us < best[kind]["us"]:
                    best[kind] = case
            for kind, c in best.items():
                print(f"{name:8} {fmt:8} M={M:5d} best {kind}: {c['us']:8.1f} us {c['GBps']:6.0f} GB/s "
                      f"{c['TFLOPs']:6.1f} TFLOP/s {c['config']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tune_quant_fp8.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
