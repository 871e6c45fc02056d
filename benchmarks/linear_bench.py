"""Few-row linear on one GPU: the Triton GEMV kernel beside torch (cuBLAS), in TB/s of weight read
against a device-to-device copy measured in the same run.

    python benchmarks/linear_bench.py --json linear.json

For Qwen3-0.6B's and Qwen3-8B's projections at M = 1, 8 and 16 rows, each op is timed as the decode
loop runs it: calls on distinct weight copies (together over 4x the L2) captured back to back in one
CUDA graph, median of the replays. Every kernel configuration in the sweep is checked against torch
before it is timed. `--compile-only --shard i/n` compiles a share of the sweep's kernels (run
several at once to fill Triton's cache in parallel); `--tiny` checks the script on the CPU under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kernel_bench import Bench  # benchmarks/ is on the path when run as a script

# (model, projection) -> [N, K] of the weight
SHAPES = {
    ("qwen3-0.6b", "qkv"): (4096, 1024),
    ("qwen3-0.6b", "o"): (1024, 2048),
    ("qwen3-0.6b", "gate_up"): (6144, 1024),
    ("qwen3-0.6b", "down"): (1024, 3072),
    ("qwen3-0.6b", "lm_head"): (151936, 1024),
    ("qwen3-8b", "qkv"): (6144, 4096),
    ("qwen3-8b", "o"): (4096, 4096),
    ("qwen3-8b", "gate_up"): (24576, 4096),
    ("qwen3-8b", "down"): (4096, 12288),
    ("qwen3-8b", "lm_head"): (151936, 4096),
}
TINY_SHAPES = {("tiny", "qkv"): (96, 64), ("tiny", "down"): (32, 256)}
LAYER_PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Variant:
    """A kernel configuration; the split comes from the shape (programs_per_sm 0: no split)."""

    name: str
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    use_dot: bool
    programs_per_sm: int = 4


SWEEP = {
    1: [
        Variant("ew16x1024", 16, 1024, 4, 1, False),
        Variant("ew16x1024 nosplit", 16, 1024, 4, 1, False, 0),
        Variant("ew16x1024 pps8", 16, 1024, 4, 1, False, 8),
        Variant("ew8x1024", 8, 1024, 4, 1, False),
        Variant("ew16x512", 16, 512, 4, 1, False),
        Variant("ew32x1024 w8", 32, 1024, 8, 1, False),
        Variant("dot32x256 s3", 32, 256, 4, 3, True),
        Variant("dot64x128 s4", 64, 128, 4, 4, True),
    ],
    8: [
        Variant("dot32x256 s3", 32, 256, 4, 3, True),
        Variant("dot32x256 s3 nosplit", 32, 256, 4, 3, True, 0),
        Variant("dot32x256 s3 pps8", 32, 256, 4, 3, True, 8),
        Variant("dot16x256 s3", 16, 256, 4, 3, True),
        Variant("dot64x128 s4", 64, 128, 4, 4, True),
        Variant("dot32x512 s2", 32, 512, 4, 2, True),
        Variant("dot64x256 s3 w8", 64, 256, 8, 3, True),
    ],
    16: [
        Variant("dot32x256 s3", 32, 256, 4, 3, True),
        Variant("dot16x256 s3", 16, 256, 4, 3, True),
        Variant("dot64x128 s4", 64, 128, 4, 4, True),
    ],
}


def config_for(v: Variant, N: int, K: int, device: torch.device):
    from hotpath.ops.linear import triton_gemv

    block_k = min(v.block_k, max(16, 1 << (K - 1).bit_length()))
    n_tiles = -(-N // v.block_n)
    split = (triton_gemv.split_for(n_tiles, K, block_k, device, v.programs_per_sm)
             if v.programs_per_sm else 1)
    return triton_gemv.GemvConfig(v.block_n, block_k, split, v.num_warps, v.num_stages, v.use_dot)


def plan(tiny: bool):
    shapes = TINY_SHAPES if tiny else SHAPES
    return [(key, M, v) for key in shapes for M in SWEEP for v in SWEEP[M]]


def compile_only(shard: int, num_shards: int, device: str, dtype, tiny: bool) -> None:
    from hotpath.ops.linear import triton_gemv

    shapes = TINY_SHAPES if tiny else SHAPES
    for i, (key, M, v) in enumerate(plan(tiny)):
        if i % num_shards != shard:
            continue
        N, K = shapes[key]
        w = torch.empty(N, K, device=device, dtype=dtype)
        x = torch.randn(M, K, device=device, dtype=dtype)
        triton_gemv.linear(x, w, config=config_for(v, N, K, w.device))
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(bench: Bench, numel: int) -> float:
    """Bytes per second of a bf16 device-to-device copy, counting bytes read and written."""
    src = torch.randn(numel, device=bench.device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * numel * 2 / bench.time_ms(lambda: dst.copy_(src)) * 1e3


def run(bench: Bench, dtype, tiny: bool, sweep: bool) -> dict:
    from hotpath.ops import linear
    from hotpath.ops.linear import triton_gemv

    device = bench.device
    results = bench.results
    n = (1 << 14) if tiny else (1 << 30)  # 2 GiB of bf16
    copy_TBps = copy_bandwidth(bench, n) / 1e12
    results["copy_TBps"] = copy_TBps
    bench.row(f"d2d copy {copy_TBps:.2f} TB/s (read + write)")
    shapes = TINY_SHAPES if tiny else SHAPES
    ops = results.setdefault("ops", {})
    for (model, proj), (N, K) in shapes.items():
        nbytes = N * K * dtype.itemsize
        weights = [torch.randn(N, K, device=device, dtype=dtype)
                   for _ in range(max(2, min(64, math.ceil(256 * 2**20 / nbytes))))]
        for M, variants in SWEEP.items():
            variants = variants if sweep else []
            x = torch.randn(M, K, device=device, dtype=dtype)
            want = F.linear(x, weights[0]).float()
            key = f"{model} {proj} M{M}"
            entry = ops[key] = {"N": N, "K": K, "M": M, "weight_bytes": nbytes,
                                "dispatch_gemv": linear.use_gemv(x, weights[0])}
            torch_us = bench.graph_us([lambda w=w: F.linear(x, w) for w in weights])
            entry["torch_us"] = torch_us
            entry["variants"] = {}
            for v in variants:
                cfg = config_for(v, N, K, weights[0].device)
                record = entry["variants"][v.name] = {"config": asdict(cfg)}
                try:
                    out = triton_gemv.linear(x, weights[0], config=cfg).float()
                    err = record["rel_err_vs_torch"] = float((out - want).norm() / want.norm())
                    if not err < 2e-2:  # NaN fails too
                        record["error"] = f"wrong result: relative error {err:.3g}"
                    else:
                        record["us"] = bench.graph_us([lambda w=w, cfg=cfg: triton_gemv.linear(
                            x, w, config=cfg) for w in weights])
                except Exception as e:  # a config the compiler or the GPU refuses: keep going
                    record["error"] = repr(e)[-500:]
                if "error" in record:
                    bench.row(f"{key} {v.name}: {record['error'][:200]}")
            default = triton_gemv.choose_config(M, N, K, weights[0].device)
            entry["default_config"] = asdict(default)
            entry["default_us"] = bench.graph_us(
                [lambda w=w: triton_gemv.linear(x, w) for w in weights])
            entry["torch_us_again"] = bench.graph_us([lambda w=w: F.linear(x, w) for w in weights])
            timed = {k: r["us"] for k, r in entry["variants"].items() if "us" in r}
            timed = timed or {"default": entry["default_us"]}
            entry["dispatch_us"] = entry["default_us"] if entry["dispatch_gemv"] else torch_us
            best = min(timed, key=timed.get)
            entry["best"], entry["best_us"] = best, timed[best]
            print("   sweep us: " + ", ".join(f"{k} {u:.1f}" for k, u in timed.items()), flush=True)
            tbps = lambda us: nbytes / us / 1e6  # noqa: E731
            bench.row(
                f"{key:<22} {N:>6}x{K:<5} torch {torch_us:6.1f} us {tbps(torch_us):4.2f} TB/s"
                f" ({entry['torch_us_again']:.1f}) | default {entry['default_us']:6.1f} us"
                f" {tbps(entry['default_us']):4.2f} | best {timed[best]:6.1f} us"
                f" {tbps(timed[best]):4.2f} {best} | dispatch: "
                + ("triton" if entry["dispatch_gemv"] else "torch")
            )
        del weights
    # a decoder layer's four projections (and the LM head) read back to back, per model and M
    for model in sorted({m for m, _ in shapes}):
        for M in SWEEP:
            keys = [f"{model} {p} M{M}" for p in LAYER_PROJECTIONS if f"{model} {p} M{M}" in ops]
            if not keys:
                continue
            nbytes = sum(ops[k]["weight_bytes"] for k in keys)
            sums = {f: sum(ops[k][f] for k in keys)
                    for f in ("torch_us", "default_us", "best_us", "dispatch_us")}
            results.setdefault("layers", {})[f"{model} M{M}"] = {"weight_bytes": nbytes, **sums}
            bench.row(
                f"{model} layer M{M}: torch {sums['torch_us']:.1f} us "
                f"{nbytes / sums['torch_us'] / 1e6:.2f} TB/s | default "
                f"{sums['default_us']:.1f} us {nbytes / sums['default_us'] / 1e6:.2f} | "
                f"best per op {sums['best_us']:.1f} us {nbytes / sums['best_us'] / 1e6:.2f} | "
                f"as dispatched {sums['dispatch_us']:.1f} us "
                f"{nbytes / sums['dispatch_us'] / 1e6:.2f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--tiny", action="store_true", help="toy sizes, to check the script")
    parser.add_argument("--no-sweep", action="store_true", help="time the default tiles only")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--shard", default="0/1",
                        help="i/n: this process's share of --compile-only")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    if args.compile_only:
        shard, num_shards = map(int, args.shard.split("/"))
        compile_only(shard, num_shards, device, dtype, args.tiny)
        return
    if args.tiny:
        from hotpath.ops import backend

        backend.set_backend("triton")
    torch.manual_seed(0)
    bench = Bench(device, args.tiny)
    start = time.perf_counter()
    try:
        run(bench, dtype, args.tiny, sweep=not args.no_sweep)
    finally:
        bench.results["seconds"] = time.perf_counter() - start
        print("\n".join(["", "summary:"] + bench.rows), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(bench.results, f, indent=1)


if __name__ == "__main__":
    main()
