"""Quantized linear kernels against bf16 at Qwen3-8B's projection shapes, on one GPU.

For each projection (qkv, o, gate_up, down) and 1, 16 and 8192 rows: the bf16 op the engine runs
(hotpath.ops.linear: the Triton GEMV or cuBLAS), fp8 per-channel (PTPC), fp8 128x128 blocks and
int4 (AWQ layout, groups of 128) through hotpath.ops.quant. Each is checked against its reference
first, then timed (CUDA graphs of 20 calls for the few-row cases, triton.testing.do_bench for
8192 rows; medians). Reported: microseconds, GB/s of the bytes stored (weight + scales + zeros;
the bandwidth a GEMV must approach), TFLOP/s for the 8192-row GEMMs, and the device-to-device copy
bandwidth measured in the same run (bytes read + written).

    python benchmarks/bench_quant_gemv.py --out $OUT     # writes $OUT/bench_quant_gemv.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton

from hotpath.ops import linear, quant
from hotpath.ops.quant import reference

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
ROWS = (1, 16, 8192)
GROUP = 128


def make_weights(N: int, K: int, device: str) -> dict[str, tuple]:
    """Random weights at [N, K] in each format, as (op, args, stored bytes)."""
    g = torch.Generator(device).manual_seed(N + K)
    w = torch.randn(N, K, generator=g, device=device, dtype=torch.bfloat16) / K**0.5
    f8 = quant.fp8_dtype(torch.device(device))
    fmax = reference.fp8_max(f8)
    ch_scale = w.float().abs().amax(1).clamp_min(1e-8) / fmax  # [N]
    w_ch = (w.float() / ch_scale[:, None]).clamp(-fmax, fmax).to(f8)
    bn, bk = 128, 128
    blocks = torch.nn.functional.pad(w.float(), (0, -K % bk, 0, -N % bn))
    blocks = blocks.view(-(-N // bn), bn, -(-K // bk), bk)
    bl_scale = blocks.abs().amax((1, 3)).clamp_min(1e-8) / fmax  # [N / 128, K / 128]
    w_bl = (w.float() / bl_scale.repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K])
    w_bl = w_bl.clamp(-fmax, fmax).to(f8)
    qweight = torch.randint(-2**31, 2**31 - 1, (N, K // 8), generator=g, device=device, dtype=torch.int32)
    scales = (torch.rand(N, K // GROUP, generator=g, device=device) / 100).to(torch.bfloat16)
    zeros = torch.randint(0, 16, (N, K // GROUP), generator=g, device=device, dtype=torch.uint8)
    nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {
        "bf16": (lambda x: linear.linear(x, w), None, nbytes(w)),
        "fp8_ptpc": (lambda x: quant.fp8_linear(x, w_ch, ch_scale, None),
                     lambda x: reference.fp8_linear(x, w_ch, ch_scale, None), nbytes(w_ch, ch_scale)),
        "fp8_block": (lambda x: quant.fp8_linear(x, w_bl, bl_scale, (bn, bk)),
                      lambda x: reference.fp8_linear(x, w_bl, bl_scale, (bn, bk)), nbytes(w_bl, bl_scale)),
        "int4_awq": (lambda x: quant.int4_linear(x, qweight, scales, zeros, GROUP),
                     lambda x: reference.int4_linear(x, qweight, scales, zeros, GROUP),
                     nbytes(qweight, scales, zeros)),
    }


def time_us(fn, rows: int) -> float:
    if rows <= quant.GEMV_MAX_ROWS:
        fn()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(20):
                    fn()
        return triton.testing.do_bench(graph.replay, warmup=50, rep=300, return_mode="median") * 1e3 / 20
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB, GB/s of bytes read + written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * src.numel() / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    device = "cuda"
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "triton": triton.__version__,
              "copy_GBps": copy_bandwidth(), "cases": []}
    for name, (N, K) in SHAPES.items():
        for fmt, (op, ref, nbytes) in make_weights(N, K, device).items():
            for rows in ROWS:
                x = torch.randn(rows, K, device=device, dtype=torch.bfloat16)
                err = None
                if ref is not None:
                    want = ref(x).double()
                    err = float((op(x).double() - want).norm() / want.norm())
                us = time_us(lambda: op(x), rows)
                case = {"proj": name, "N": N, "K": K, "format": fmt, "rows": rows, "us": us,
                        "bytes": nbytes, "GBps": nbytes / us / 1e3, "rel_err": err}
                if rows > quant.GEMV_MAX_ROWS:
                    case["TFLOPs"] = 2 * rows * N * K / us / 1e6
                result["cases"].append(case)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_quant_gemv.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}: copy {result['copy_GBps']:.0f} GB/s (read + written)")
    print(f"{'proj':8} {'format':10} {'rows':>5} {'us':>9} {'GB/s':>7} {'TFLOP/s':>8} {'rel_err':>8}")
    for c in result["cases"]:
        print(f"{c['proj']:8} {c['format']:10} {c['rows']:5d} {c['us']:9.1f} {c['GBps']:7.0f} "
              f"{c.get('TFLOPs', 0):8.1f} {c['rel_err'] if c['rel_err'] is not None else 0:8.1e}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
