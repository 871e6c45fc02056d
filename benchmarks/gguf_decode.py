"""GGUF models kept quantized against their 16-bit copy, on a GPU without the real files (the device
machine has no network and a 64 MiB carry): a GGUF of random blocks in a real file's layout (each
tensor's type and shape, and the model's config), made on the machine.

    # here, from a real GGUF: its layout (a few KB, committed under benchmarks/gguf_layouts/)
    python benchmarks/gguf_decode.py layout ~/.cache/hotpath/models/.../x.gguf benchmarks/gguf_layouts/x.json
    # there: the random GGUF, its converted directory and a plain HF directory of its 16-bit copy
    python benchmarks/gguf_decode.py build benchmarks/gguf_layouts/x.json /tmp/x
    #   -> /tmp/x/gguf-dir (kept quantized on a GPU) and /tmp/x/bf16-dir, for `hotpath bench latency --model`
    # there: each distinct linear (type, N, K) of the layout, its kernel's bandwidth (weight bytes /
    # time) at 1..64 rows beside the bf16 linear of the same shape
    python benchmarks/gguf_decode.py kernels benchmarks/gguf_layouts/x.json --json out.json
    # anywhere (no GPU): what the GEMV compiles to for an H200, each type's largest layer
    python benchmarks/gguf_decode.py codegen benchmarks/gguf_layouts/x.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # int4_codegen, launch_capture (codegen)

from hotpath.loader import gguf as gguf_loader  # noqa: E402
from hotpath.ops.gguf import reference  # noqa: E402

ROWS = (1, 4, 16, 32, 64)


def layout(gguf_path: str, out: str) -> None:
    parsed = gguf_loader.open_gguf(gguf_path)
    model_dir = gguf_loader.gguf_to_hf_dir(gguf_path)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = [[t.name, t.qtype.name, list(t.shape)] for t in parsed.tensors]
    Path(out).write_text(json.dumps({"source": Path(gguf_path).name,
                                     "architecture": parsed.metadata["general.architecture"],
                                     "config": config, "tensors": tensors}, indent=1) + "\n")


def build(layout_path: str, out: str, seed: int = 0) -> None:
    import gguf

    spec = json.loads(Path(layout_path).read_text())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    path = out_dir / "model.gguf"
    writer = gguf.GGUFWriter(str(path), spec["architecture"])
    for name, qtype, shape in spec["tensors"]:
        if qtype in reference.FORMATS:
            writer.add_tensor(name, reference.random_blocks(qtype, int(np.prod(shape[:-1])), shape[-1], rng),
                              raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:  # F32 norms and biases
            scale, offset = (0.1, 1.0) if name.endswith("norm.weight") else (0.1, 0.0)
            writer.add_tensor(name, (offset + scale * rng.standard_normal(shape)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    def config_only(gguf_path: Path, target: Path) -> None:  # the random file has no tokenizer
        (target / "config.json").write_text(json.dumps(spec["config"]))

    gguf_loader._write_config_and_tokenizer = config_only
    converted = gguf_loader.gguf_to_hf_dir(path, cache_dir=out_dir / "cache")
    link = out_dir / "gguf-dir"
    link.unlink(missing_ok=True)
    link.symlink_to(converted)
    plain = gguf_loader.dequantized_copy(converted, torch.bfloat16, out_dir / "bf16-dir")
    print(f"{link} -> {converted}\n{plain}")


def _time(fn, iters: int = 200) -> float:
    """Seconds a call, replayed in a CUDA graph (no launch gaps between calls)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters // 10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def kernels(layout_path: str, out: str | None, do_sweep: bool = False) -> None:
    from hotpath.ops.gguf import gguf_linear
    from hotpath.ops.linear import linear

    spec = json.loads(Path(layout_path).read_text())
    shapes = sorted({(qtype, shape[0], shape[1]) for name, qtype, shape in spec["tensors"]
                     if qtype in reference.FORMATS and name.startswith("blk.")})
    rng = np.random.default_rng(0)
    results = []
    for qtype, N, K in shapes:
        raw = torch.from_numpy(reference.random_blocks(qtype, N, K, rng)).cuda()
        w = reference.repack(reference.FORMATS[qtype], raw, K)
        dense = reference.dequantize(w).to(torch.bfloat16)
        w_bytes = sum(t.numel() * t.element_size() for t in w.tensors().values())
        for M in ROWS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t_q = _time(lambda: gguf_linear(x, w))
            t_bf16 = _time(lambda: linear(x, dense))
            row = {"type": qtype, "N": N, "K": K, "rows": M, "weight_bytes": w_bytes,
                   "gguf_us": t_q * 1e6, "gguf_GBps": w_bytes / t_q / 1e9,
                   "bf16_us": t_bf16 * 1e6, "bf16_GBps": 2 * N * K / t_bf16 / 1e9,
                   "speedup_vs_bf16": t_bf16 / t_q}
            results.append(row)
            print(f"{qtype:5} [{N:6}, {K:5}] rows {M:3}: gguf {t_q * 1e6:7.1f} us {row['gguf_GBps']:7.0f} GB/s"
                  f" | bf16 {t_bf16 * 1e6:7.1f} us {row['bf16_GBps']:7.0f} GB/s | x{row['speedup_vs_bf16']:.2f}")
    sweep = []
    if do_sweep:  # tiles at one row and 16: each type's largest layer of two types
        from dataclasses import replace

        from hotpath.ops.gguf import triton_linear

        largest = {}
        for qtype, N, K in shapes:
            if N * K > largest.get(qtype, (0, 0, 0))[1] * largest.get(qtype, (0, 0, 0))[2]:
                largest[qtype] = (qtype, N, K)
        picked = sorted(largest.values(), key=lambda t: -t[1] * t[2])
        picked = [next(t for t in picked if t[0] not in ("Q4_K", "Q5_K", "Q6_K")),
                  next(t for t in picked if t[0] in ("Q4_K", "Q5_K", "Q6_K"))]
        for qtype, N, K in picked:
            raw = torch.from_numpy(reference.random_blocks(qtype, N, K, rng)).cuda()
            w = reference.repack(reference.FORMATS[qtype], raw, K)
            w_bytes = sum(t.numel() * t.element_size() for t in w.tensors().values())
            for M in (1, 16):
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                base = triton_linear.choose_config(M, N, K, w.fmt, x.device)
                # groups a K tile: filling the dot's 16 rows (block-diagonal below 16 rows of x),
                # and twice that
                gpis = sorted({base.gpi, 2 * base.gpi})
                for gpi, block_n, (warps, stages), per_sm in itertools.product(
                        gpis, (16, 32, 64, 128), ((4, 3), (8, 3), (4, 2)), (0, 2, 4)):
                    if block_n * gpi * w.fmt.group > 2 * triton_linear.TILE_CODES:
                        continue
                    # per_sm 0: no K split
                    split = 1 if per_sm == 0 else triton_linear.split_for(
                        triton.cdiv(N, block_n), K, w.fmt.group * gpi, x.device, per_sm)
                    cfg = replace(base, block_n=block_n, gpi=gpi, num_warps=warps, num_stages=stages,
                                  split_k=split)
                    try:
                        t = _time(lambda: triton_linear.gguf_linear(x, w, config=cfg), 100)
                    except Exception as e:  # out of shared memory / registers
                        print(f"{cfg}: {type(e).__name__}")
                        continue
                    sweep.append({"type": qtype, "N": N, "K": K, "rows": M, "config": str(cfg),
                                  "us": t * 1e6, "GBps": w_bytes / t / 1e9})
                best = sorted((r for r in sweep if r["rows"] == M and r["type"] == qtype and r["N"] == N),
                              key=lambda r: r["us"])[:5]
                for r in best:
                    print(f"sweep {qtype} [{N}, {K}] rows {M}: {r['us']:.1f} us {r['GBps']:.0f} GB/s {r['config']}")
    if out:
        Path(out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "layout": spec["source"],
                                         "results": results, "sweep": sweep}, indent=1) + "\n")


def codegen(layout_path: str) -> None:
    """What the GEMV compiles to for an H200 (no GPU needed; benchmarks/int4_codegen.py's facts):
    each type's largest layer of the layout at 1, 4, 16 and 32 rows with the default tiles."""
    import contextlib
    from dataclasses import replace

    import int4_codegen as cg
    import launch_capture

    from hotpath.ops.gguf import empty_weight
    from hotpath.ops.gguf import triton_linear

    spec = json.loads(Path(layout_path).read_text())
    largest: dict[str, tuple[int, int]] = {}
    for name, qtype, shape in spec["tensors"]:
        if qtype in reference.FORMATS and shape[0] * shape[1] > np.prod(largest.get(qtype, (0, 0))):
            largest[qtype] = (shape[0], shape[1])
    meta = torch.device("meta")
    with contextlib.ExitStack() as stack:
        for module in (triton_linear, cg.triton_gemv):
            stack.enter_context(launch_capture.sms_seen(cg.H200_SMS, module))
        for qtype, (N, K) in sorted(largest.items()):
            w = empty_weight(qtype, N, K, meta)
            for M in (1, 4, 16, 32):
                # the PTX dequantization, which the host picks on NVIDIA GPUs only (not on meta tensors)
                cfg = replace(triton_linear.choose_config(M, N, K, w.fmt, cg._H200), asm=True)
                x = torch.empty(M, K, dtype=torch.bfloat16, device=meta)
                kernel = "_gguf_sliced_kernel" if w.fmt.bits < 8 else "_gguf_bytes_kernel"
                cap = launch_capture.capture(triton_linear, kernel,
                                             lambda: triton_linear.gguf_linear(x, w, config=cfg))
                # stored code bytes a program takes an iteration, as the words facts() counts
                cols = triton_linear.RUN if w.fmt.bits < 8 else cfg.gpi * w.fmt.group
                words = cfg.block_n * cols * w.fmt.bits / 32
                f = cg.facts(cap, int(words))
                print(f"{qtype:5} [{N:6}, {K:5}] rows {M:2}: {f['regs']:3} regs, spill {f['spill']}, "
                      f"{f['loop_instrs']:5} loop instructions, {f['instr_per_B']:6.2f} a byte, "
                      f"{f['sync_ld_in_loop']} synchronous loads, {f['smem_roundtrip_in_loop']} shared-memory "
                      f"round trips, {f['BAR']} barriers  {cfg}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("layout", help="a real GGUF's tensor types and shapes and its config -> JSON")
    a.add_argument("gguf")
    a.add_argument("out")
    b = sub.add_parser("build", help="a random GGUF in a layout, converted, and its 16-bit HF copy")
    b.add_argument("layout")
    b.add_argument("out")
    k = sub.add_parser("kernels", help="each linear's GGUF kernel against bf16, 1..64 rows")
    k.add_argument("layout")
    k.add_argument("--json", default=None)
    k.add_argument("--sweep", action="store_true", help="also time tile configs on two shapes")
    c = sub.add_parser("codegen", help="what the GEMV compiles to for an H200, on any machine")
    c.add_argument("layout")
    ns = p.parse_args()
    os.environ.setdefault("HOTPATH_CACHE", "/tmp/hotpath-cache")
    if ns.cmd == "layout":
        layout(ns.gguf, ns.out)
    elif ns.cmd == "build":
        build(ns.layout, ns.out)
    elif ns.cmd == "codegen":
        codegen(ns.layout)
    else:
        kernels(ns.layout, ns.json, ns.sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
