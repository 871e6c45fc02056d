"""What the int4 kernels (hotpath/ops/quant/triton_int4.py) compile to on an H200 (sm_90), read on
any Linux machine (no GPU: Triton's wheel carries ptxas, cuobjdump and nvdisasm), for each tile
config that benchmarks/bench_quant_gemv.py --sweep times, so that the sweep's timings can be laid
beside the code each config runs.

    python benchmarks/int4_codegen.py                 # the default configs at Qwen3-8B's shapes
    python benchmarks/int4_codegen.py --sweep         # every candidate of bench_quant_gemv --sweep
    python benchmarks/int4_codegen.py --json out.json # the rows as JSON too
    python benchmarks/int4_codegen.py --dump DIR      # ttgir, ptx and sass of each config into DIR

Per config (the launch captured from the real host function, compiled as a launch on an H200
would specialise it, the PTX dequantization on, PDL on):
- regs / spill / smem: registers a thread, bytes spilled a thread, shared memory a program;
- ttgir: the layout conversions (`convert_layout`, and those that go through shared memory:
  `local_alloc` + `local_load` of a register tensor), the dots (`wgmma` = Hopper's warpgroup MMA,
  `mma` = mma.sync) and the waits on warpgroup MMAs, the loads left synchronous in the main loop
  (`syncld`: a global load the pipeliner did not turn into an asynchronous copy and whose value
  the same iteration uses, so that every iteration waits a memory round trip; `ahead`: such
  loads whose values are carried to the next iteration, prefetched a tile ahead by hand);
- the main loop in SASS (the loop with the most tensor-core instructions): instructions a
  thread per iteration and per weight byte (the bytes of qweight a program consumes an
  iteration, over its threads), and the mix: global loads (LDG: synchronous; LDGSTS: the
  asynchronous copies, with their widths), shared-memory loads (LDS, LDSM), tensor-core
  instructions and their waits, the dequantization's LOP3 / SHF / PRMT / HFMA2 (+ HADD2, HMUL2),
  barriers (BAR) and fences (MEMBAR, FENCE).

An H200 SM issues 4 warp instructions a cycle (128 thread instructions); at 4.2 TB/s over 132 SMs
at ~1.8 GHz it must take in ~18 weight bytes a cycle, so a GEMV loop above ~7 instructions a
weight byte cannot reach the bandwidth even at perfect issue, and ~3 is a realistic ceiling.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the kernels must be compiled, not interpreted")

import torch  # noqa: E402
import triton.backends.nvidia  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from hotpath.ops.linear import triton_gemv  # noqa: E402
from hotpath.ops.quant import triton_int4  # noqa: E402
from hotpath.ops.triton_utils import compile_launch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import launch_capture  # noqa: E402
from launch_capture import Launch  # noqa: E402

META = torch.device("meta")
SM90 = GPUTarget("cuda", 90, 32)
H200_SMS = 132
TOOLS = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin")
GROUP = 128
# Qwen3-8B's projections [rows, K] and the fused form the decode step runs each in
SHAPES = {"qkv": (6144, 4096, "rms"), "o": (4096, 4096, "residual"),
          "gate_up": (24576, 4096, "gated"), "down": (4096, 12288, "residual")}


def e(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=META)


def capture(kernel_name: str, launch) -> Launch:
    return launch_capture.capture(triton_int4, kernel_name, launch)


def gemv_launch(proj: str, rows: int, cfg) -> Launch:
    N, K, form = SHAPES[proj]
    w = (e(N, K // 8, dtype=torch.int32), e(N, K // GROUP), e(N, K // GROUP, dtype=torch.uint8), GROUP)
    cfg = replace(cfg, asm=True)
    # (the decode step's rms= input is normalised by the RMSNorm kernel before the GEMV, which
    # then compiles as without it: the forms here leave it out)
    if form == "rms":
        run = lambda: triton_int4.int4_linear(e(rows, K), *w, config=cfg)  # noqa: E731
    elif form == "gated":
        run = lambda: triton_int4.int4_linear_silu_and_mul(e(rows, K), *w, config=cfg)  # noqa: E731
    else:
        run = lambda: triton_int4.int4_linear_add_residual(e(rows, K), *w, None, e(rows, N), config=cfg)  # noqa: E731
    return capture("_int4_gemv_kernel", run)


def gemm_launch(proj: str, rows: int, cfg) -> Launch:
    N, K, _ = SHAPES[proj]
    w = (e(N, K // 8, dtype=torch.int32), e(N, K // GROUP), e(N, K // GROUP, dtype=torch.uint8), GROUP)
    return capture("_int4_gemm_kernel", lambda: triton_int4.int4_gemm(
        e(rows, K), *w, config=replace(cfg, asm=True)))


def _sass(cubin: bytes) -> tuple[list[tuple[int, str]], str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    instrs = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            instrs.append((int(m.group(1), 16), m.group(2).strip()))
    return instrs, usage


def _opcode(text: str) -> str:
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def main_loop(instrs: list[tuple[int, str]]) -> list[str]:
    """The body of the backward branch with the most tensor-core instructions."""
    best, best_mma = [], -1
    for i, (addr, text) in enumerate(instrs):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [t for a, t in instrs[: i + 1] if a >= target]
        mma = sum(_opcode(t).startswith(("HGMMA", "HMMA")) for t in body)
        if mma > best_mma:
            best, best_mma = body, mma
    return [_opcode(t) for t in best]


CLASSES = {
    "LDG": lambda op: op.startswith("LDG.") or op == "LDG",
    "LDGSTS": lambda op: op.startswith("LDGSTS"),
    "LDS": lambda op: op.startswith("LDS") and not op.startswith("LDSM"),
    "LDSM": lambda op: op.startswith("LDSM"),
    "STS": lambda op: op.startswith("STS"),
    "HGMMA": lambda op: op.startswith("HGMMA"),
    "HMMA": lambda op: op.startswith("HMMA"),
    "WG_WAIT": lambda op: op.startswith("WARPGROUP.DEPBAR"),
    "LOP3": lambda op: op.startswith("LOP3"),
    "SHF": lambda op: op.startswith(("SHF", "SHL", "SHR")),
    "PRMT": lambda op: op.startswith("PRMT"),
    "HFMA2": lambda op: op.startswith(("HFMA2", "HADD2", "HMUL2")),
    "BAR": lambda op: op.startswith("BAR"),
    "FENCE": lambda op: op.startswith(("MEMBAR", "FENCE")),
}


def facts(cap: Launch, words_per_iter: int) -> dict:
    """Codegen facts of one captured launch; `words_per_iter`: qweight words a program takes in
    its main loop's iteration."""
    kernel = compile_launch(cap.fn, cap.args, cap.kwargs, SM90)
    ttgir = kernel.asm["ttgir"]
    instrs, usage = _sass(kernel.asm["cubin"])
    res = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    threads = 32 * kernel.metadata.num_warps
    # the ttgir main loop: the scf.for holding the dots
    loops = re.findall(r"scf\.for .*?\n(.*?\n\s*scf\.yield[^\n]*)", ttgir, re.S)
    loop = max(loops, key=lambda b: b.count("dot"), default="")
    loop_lines = loop.splitlines()
    yielded = loop_lines[-1] if loop_lines else ""
    sync, ahead = 0, 0
    for i, ln in enumerate(loop_lines):
        m = re.match(r"\s*(%[\w]+) = tt\.load ", ln)
        if not m:
            continue
        # carried to the next iteration (directly or through one conversion): loaded a tile ahead
        names = {m.group(1)} | {u.group(1) for u in (re.match(r"\s*(%[\w]+) = arith\.ext\w+ " + re.escape(m.group(1)) + r"\b", x)
                                                     for x in loop_lines[i + 1:]) if u}
        if any(re.search(re.escape(n) + r"\b", yielded) for n in names):
            ahead += 1
        else:
            sync += 1
    out = {
        "regs": int(res.group(1)), "spill": int(res.group(2)), "smem": kernel.metadata.shared,
        "warps": kernel.metadata.num_warps,
        "convert_layout": ttgir.count("ttg.convert_layout"),
        "convert_in_loop": loop.count("ttg.convert_layout"),
        # a register tensor stored to shared memory and read back in the loop: a layout change
        # through shared memory (loads the pipeliner made asynchronous land with async_copy)
        "smem_roundtrip_in_loop": sum("ttg.local_alloc %" in ln and "tensor<" in ln for ln in loop_lines),
        "local_load_in_loop": loop.count("ttg.local_load"),
        "wgmma_in_loop": loop.count("ttng.warp_group_dot "),
        "wgmma_wait_in_loop": loop.count("ttng.warp_group_dot_wait"),
        "mma_v2_in_loop": loop.count("tt.dot "),
        "async_copy_in_loop": loop.count("async_copy_global_to_local"),
        "sync_ld_in_loop": sync,
        "prefetch_ld_in_loop": ahead,
    }
    body = main_loop(instrs)
    mix = collections.Counter()
    for op in body:
        for name, test in CLASSES.items():
            if test(op):
                mix[name] += 1
    widths = collections.Counter(op for op in body if op.startswith(("LDGSTS", "LDG")))
    bytes_per_thread = 4 * words_per_iter / threads
    out.update({"loop_instrs": len(body), "weight_B_per_thread_iter": bytes_per_thread,
                "instr_per_B": round(len(body) / bytes_per_thread, 2) if body else None,
                **{k: mix[k] for k in CLASSES}, "global_loads": dict(widths)})
    out["_asm"] = kernel.asm
    return out


def words_per_iter_gemv(cfg) -> int:
    return cfg.block_n * cfg.block_w * getattr(cfg, "unroll", 1)


def words_per_iter_gemm(cfg) -> int:
    return cfg.block_n * cfg.block_w


def configs(sweep: bool) -> list[tuple[str, str, int, object]]:
    """(kind, proj, rows, config)."""
    out = []
    for proj, (N, K, _) in SHAPES.items():
        for rows in (1, 16, 32):
            out.append(("gemv", proj, rows, triton_int4.choose_gemv_config(rows, N, K, 16, _H200)))
        out.append(("gemm", proj, 8192, triton_int4.choose_gemm_config(8192, 16, _H200)))
    if sweep:
        import bench_quant_gemv as bench

        seen = {(k, c) for k, _, _, c in out}
        for proj, (N, K, _) in SHAPES.items():
            for c in bench.gemv_candidates(1, N, K, _H200):
                if c is not None and ("gemv", c) not in seen:
                    seen.add(("gemv", c))
                    out.append(("gemv", proj, 1, c))
        for c in bench.gemm_candidates():
            if ("gemm", c) not in seen:
                seen.add(("gemm", c))
                out.append(("gemm", "gate_up", 8192, c))
    return out


class _H200Device:
    """torch.device("cuda") as the config rules see it, without a GPU (see sms_seen)."""
    type = "cuda"
    index = 0


_H200 = _H200Device()


def _facts(kind: str, proj: str, rows: int, cfg) -> dict | Exception:
    try:
        if kind == "gemv":
            return facts(gemv_launch(proj, rows, cfg), words_per_iter_gemv(cfg))
        return facts(gemm_launch(proj, rows, cfg), words_per_iter_gemm(cfg))
    except Exception as ex:  # a config that does not compile
        return ex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="every bench_quant_gemv --sweep candidate")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--dump", help="write each config's ttgir, ptx and sass here")
    args = parser.parse_args()
    cols = ["regs", "spill", "smem", "convert_in_loop", "smem_roundtrip_in_loop", "sync_ld_in_loop",
            "prefetch_ld_in_loop",
            "wgmma_in_loop", "wgmma_wait_in_loop", "mma_v2_in_loop", "loop_instrs", "instr_per_B",
            "LDG", "LDGSTS", "LDS", "LDSM", "HGMMA", "HMMA", "WG_WAIT", "LOP3", "SHF", "PRMT", "HFMA2",
            "BAR", "FENCE"]
    short = {"convert_in_loop": "cvt", "smem_roundtrip_in_loop": "smrt", "sync_ld_in_loop": "syncld", "prefetch_ld_in_loop": "ahead",
             "wgmma_in_loop": "wgmma", "wgmma_wait_in_loop": "wgwait", "mma_v2_in_loop": "mma",
             "loop_instrs": "loop", "instr_per_B": "ins/B"}
    print(f"{'kernel':6} {'proj':8} {'rows':>5} " + " ".join(f"{short.get(c, c):>6}" for c in cols) + "  config")
    rows_out = []
    # the config rules and the launches size splits for an H200's SMs
    with launch_capture.sms_seen(H200_SMS, triton_gemv):  # split_for, which triton_int4 calls too
        for kind, proj, rows, cfg in configs(args.sweep):
            r = _facts(kind, proj, rows, cfg)
            if isinstance(r, Exception):  # a config that does not compile
                print(f"{kind:6} {proj:8} {rows:5d} error {type(r).__name__}: {str(r)[:200]} {cfg}")
                continue
            asm = r.pop("_asm")
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                stem = os.path.join(args.dump, f"{kind}_{proj}_{rows}_" + "_".join(
                    str(v) for v in asdict(cfg).values()))
                for ext in ("ttgir", "ptx"):
                    with open(f"{stem}.{ext}", "w") as f:
                        f.write(asm[ext])
                with open(f"{stem}.sass", "w") as f:
                    f.write("\n".join(t for _, t in _sass(asm["cubin"])[0]))
            print(f"{kind:6} {proj:8} {rows:5d} " + " ".join(f"{r[c] if r[c] is not None else '-':>6}" for c in cols)
                  + f"  {cfg}", flush=True)
            rows_out.append({"kernel": kind, "proj": proj, "rows": rows, "config": asdict(cfg), **r})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
