"""Quantized linear kernels against bf16 at Qwen3-8B's and Qwen2.5-Coder-32B's projection shapes,
on one GPU.

For each projection (qkv, o, gate_up, down) and 1, 4, 16, 32 and 64 rows (--rows): the bf16 op the engine runs
(hotpath.ops.linear: the Triton GEMV or cuBLAS), fp8 per-channel (PTPC), fp8 128x128 blocks and
int4 (AWQ layout, groups of 128) through hotpath.ops.quant. Each is checked against its reference
first, then timed (CUDA graphs of 20 calls up to 64 rows, triton.testing.do_bench for more;
medians). Reported: microseconds, GB/s of the bytes stored (weight + scales + zeros; the
bandwidth a decode kernel must approach), TFLOP/s past 64 rows, and the device-to-device copy
bandwidth measured in the same run (bytes read + written).

    python benchmarks/bench_quant_gemv.py --out $OUT     # writes $OUT/bench_quant_gemv.json

int4 weights are random words in the kernels' layout (hotpath/ops/quant/reference.py; any words
are valid). --sweep times candidate tiles of the int4 GEMV (1 and 16 rows) and GEMM (8192 rows)
at Qwen3-8B's and Qwen2.5-Coder-32B's shapes instead (each case appended to
$OUT/bench_int4_sweep.jsonl as it is timed, so a run cut short keeps what it measured), for
choosing triton_int4's choose_gemv_config / choose_gemm_config rules; --models picks the shapes:

    python benchmarks/bench_quant_gemv.py --sweep --models qwen3-8b --out $OUT
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
GROUP = 128
# row counts timed as CUDA graphs of 20 calls (decode sizes), more with do_bench
GRAPH_ROWS = 64


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
    if rows <= GRAPH_ROWS:
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


# Qwen2.5-Coder-32B's projections (qkv, o, gate_up, down)
SHAPES_32B = {"qkv": (7168, 5120), "o": (5120, 5120), "gate_up": (55296, 5120), "down": (5120, 27648)}


def gemv_candidates(rows: int, N: int, K: int, device: torch.device) -> list:
    """64-, 128- and 256-row tiles of 16 words, 4 warps (8 leave x's slices too small for
    asynchronous copies: benchmarks/int4_codegen.py), 3 or 4 stages, K split for about 2, 4 and
    8 programs an SM."""
    from hotpath.ops.linear.triton_gemv import split_for
    from hotpath.ops.quant.triton_int4 import Int4GemvConfig

    out = []
    for block_n in (64, 128, 256):
        splits = sorted({split_for(triton.cdiv(N, block_n), K // 8, 16, device, p) for p in (2, 4, 8)})
        for stages in (3, 4):
            for split in splits:
                out.append(Int4GemvConfig(block_n, 16, split, 4, stages))
    # the portable dequantization against the PTX one, at the default rule's tiles
    out.append(None)
    return out


def gemm_candidates() -> list:
    from hotpath.ops.quant.triton_int4 import Int4GemmConfig

    return [Int4GemmConfig(bm, bn, 16, 8, w, st) for bm, bn, w, st in
            [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2),
             (128, 128, 8, 4), (256, 128, 8, 3), (128, 256, 8, 3)]]


def sweep(out_dir: str, models: list[str], row_counts: list[int]) -> None:
    """Times int4 GEMV / GEMM tile candidates (AWQ-like: groups of 128, no act-order; the GEMV
    also with act-order's gather at the default tiles); each checked against the reference."""
    from dataclasses import asdict, replace

    from hotpath.ops.quant import triton_int4

    device = torch.device("cuda")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench_int4_sweep.jsonl")
    log = open(path, "a")
    log.write(json.dumps({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                          "torch": torch.__version__, "triton": triton.__version__}) + "\n")
    for model, shapes in (("qwen3-8b", SHAPES), ("qwen2.5-coder-32b", SHAPES_32B)):
        if model not in models:
            continue
        for proj, (N, K) in shapes.items():
            g = torch.Generator(device).manual_seed(N + K)
            qweight = torch.randint(-2**31, 2**31 - 1, (N, K // 8), generator=g, device=device, dtype=torch.int32)
            scales = (torch.rand(N, K // GROUP, generator=g, device=device) / 100).to(torch.bfloat16)
            zeros = torch.randint(0, 16, (N, K // GROUP), generator=g, device=device, dtype=torch.uint8)
            perm = torch.randperm(K, generator=g, device=device).to(torch.int32)
            nbytes = sum(t.numel() * t.element_size() for t in (qweight, scales, zeros))
            for rows in row_counts:
                x = torch.randn(rows, K, device=device, dtype=torch.bfloat16)
                want = {p: reference.int4_linear(x, qweight, scales, zeros, GROUP, p).double()
                        for p in (None, perm)} if rows <= 256 else \
                    {None: reference.int4_linear(x[:256], qweight, scales, zeros, GROUP).double()}
                if rows <= quant.GEMV_MAX_ROWS:
                    default = triton_int4.choose_gemv_config(rows, N, K, 16, device)
                    cands = [(c or replace(default, asm=False), None) for c in gemv_candidates(rows, N, K, device)]
                    cands += [(default, perm)]
                    op = lambda c, p: triton_int4.int4_linear(x, qweight, scales, zeros, GROUP, p, config=c)  # noqa: E731
                else:
                    default = triton_int4.choose_gemm_config(rows, 16, device)
                    cands = [(c, None) for c in gemm_candidates()]
                    op = lambda c, p: triton_int4.int4_gemm(x, qweight, scales, zeros, GROUP, p, config=c)  # noqa: E731
                for cfg, p in cands:
                    case = {"model": model, "proj": proj, "N": N, "K": K, "rows": rows,
                            "config": asdict(cfg), "act_order": p is not None, "default": cfg == default}
                    try:
                        got = op(cfg, p).double()
                        ref = want[p]
                        case["rel_err"] = float(((got[:256] if rows > 256 else got) - ref).norm() / ref.norm())
                        us = time_us(lambda: op(cfg, p), rows)
                        case.update(us=us, GBps=nbytes / us / 1e3, TFLOPs=2 * rows * N * K / us / 1e6)
                    except Exception as e:  # a config that does not compile or fit
                        case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    log.write(json.dumps(case) + "\n")
                    log.flush()
                    if "error" in case:
                        print(f"{model} {proj} {rows} {cfg}: {case['error'][:120]}", flush=True)
                    else:
                        print(f"{model} {proj:8} {rows:5d} {case['us']:8.1f} us {case['GBps']:6.0f} GB/s "
                              f"{case['TFLOPs']:6.1f} TF/s {case['rel_err']:.1e} {cfg}"
                              f"{' perm' if p is not None else ''}{' *' if case['default'] else ''}", flush=True)
    log.close()
    print(f"wrote {path}")


def fused_forms(out_dir: str) -> None:
    """The int4 GEMV at one row in the forms the decode chain calls (the RMSNorm folded into
    x's loads, gate/up with SiLU-and-mul, the residual add), beside the plain form, at
    Qwen2.5-Coder-32B's shapes with the default tiles."""
    from hotpath.ops.quant import triton_int4

    device = torch.device("cuda")
    res = []
    for proj, (N, K) in SHAPES_32B.items():
        g = torch.Generator(device).manual_seed(N + K)
        qweight = torch.randint(-2**31, 2**31 - 1, (N, K // 8), generator=g, device=device, dtype=torch.int32)
        scales = (torch.rand(N, K // GROUP, generator=g, device=device) / 100).to(torch.float16)
        zeros = torch.randint(0, 16, (N, K // GROUP), generator=g, device=device, dtype=torch.uint8)
        x = torch.randn(1, K, device=device, dtype=torch.float16)
        rms = (torch.rand(40, 1, device=device) * K / 40, torch.rand(K, device=device, dtype=torch.float16), 1e-6)
        residual = torch.randn(1, N, device=device, dtype=torch.float16)
        w = (qweight, scales, zeros, GROUP)
        forms = {"plain": lambda: triton_int4.int4_linear(x, *w),
                 "rms": lambda: triton_int4.int4_linear(x, *w, rms=rms),
                 "gated_rms": lambda: triton_int4.int4_linear_silu_and_mul(x, *w, rms=rms),
                 "residual": lambda: triton_int4.int4_linear_add_residual(x, *w, None, residual)}
        nbytes = sum(t.numel() * t.element_size() for t in (qweight, scales, zeros))
        for form, fn in forms.items():
            try:
                us = time_us(fn, 1)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{proj:8} {form:10} {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            res.append({"proj": proj, "form": form, "us": us, "GBps": nbytes / us / 1e3})
            print(f"{proj:8} {form:10} {us:8.1f} us {nbytes / us / 1e3:6.0f} GB/s", flush=True)
    with open(os.path.join(out_dir, "bench_int4_fused_forms.json"), "w") as f:
        json.dump(res, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--sweep", action="store_true", help="time int4 tile candidates instead")
    parser.add_argument("--models", nargs="+", default=["qwen3-8b", "qwen2.5-coder-32b"],
                        help="the shapes: qwen3-8b, qwen2.5-coder-32b")
    parser.add_argument("--fused-forms", action="store_true",
                        help="time the int4 GEMV's fused decode forms at Qwen2.5-Coder-32B's shapes instead")
    parser.add_argument("--rows", nargs="+", type=int, default=None,
                        help="row counts (default 1 4 16 32 64; the sweep's 1 16 8192: up to "
                             "quant.GEMV_MAX_ROWS the int4 GEMV, more the GEMM)")
    parser.add_argument("--once", action="store_true",
                        help="run each case once, untimed, after a warm-up call (for ncu's kernel profiles)")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    if args.fused_forms:
        fused_forms(args.out)
        return
    if args.sweep:
        sweep(args.out, args.models, args.rows or [1, 16, 8192])
        return
    device = "cuda"
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "triton": triton.__version__,
              "copy_GBps": copy_bandwidth(), "cases": []}
    print(f"{result['device']}: copy {result['copy_GBps']:.0f} GB/s (read + written)")
    print(f"{'model':18} {'proj':8} {'format':10} {'rows':>5} {'us':>9} {'GB/s':>7} {'TFLOP/s':>8} {'rel_err':>8}")
    shapes = [(m, p, nk) for m, table in (("qwen3-8b", SHAPES), ("qwen2.5-coder-32b", SHAPES_32B))
              if m in args.models for p, nk in table.items()]
    for model, name, (N, K) in shapes:
        for fmt, (op, ref, nbytes) in make_weights(N, K, device).items():
            for rows in args.rows or [1, 4, 16, 32, 64]:
                x = torch.randn(rows, K, device=device, dtype=torch.bfloat16)
                if args.once:
                    op(x)
                    torch.cuda.synchronize()
                    torch.cuda.nvtx.range_push(f"{model} {name} {fmt} {rows}")
                    op(x)
                    torch.cuda.nvtx.range_pop()
                    continue
                err = None
                if ref is not None:
                    want = ref(x).double()
                    err = float((op(x).double() - want).norm() / want.norm())
                us = time_us(lambda: op(x), rows)
                case = {"model": model, "proj": name, "N": N, "K": K, "format": fmt, "rows": rows, "us": us,
                        "bytes": nbytes, "GBps": nbytes / us / 1e3, "rel_err": err}
                if rows > GRAPH_ROWS:
                    case["TFLOPs"] = 2 * rows * N * K / us / 1e6
                result["cases"].append(case)
                print(f"{model:18} {name:8} {fmt:10} {rows:5d} {us:9.1f} {case['GBps']:7.0f} "
                      f"{case.get('TFLOPs', 0):8.1f} {err if err is not None else 0:8.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_quant_gemv.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
