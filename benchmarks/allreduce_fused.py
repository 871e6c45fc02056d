"""The one-shot all-reduce + residual add + RMSNorm kernel on real GPUs: checked against the
reference, then timed against NCCL's all-reduce followed by hotpath's fused add + RMSNorm kernel,
eager and inside CUDA graphs, at message sizes from 4 KiB (decode) to 64 MiB (prefill). Prints
the size where NCCL starts to win (the value for parallel_state.ONE_SHOT_MAX_BYTES) and writes
$OUT/allreduce_fused_tp<N>.json.

    python benchmarks/allreduce_fused.py --nproc 8 --out $OUT          # spawns 8 workers
    torchrun --nproc-per-node 8 benchmarks/allreduce_fused.py --out $OUT
    python benchmarks/allreduce_fused.py --cpu --nproc 2               # the gloo path on the CPU

`--cpu` times what a CPU worker runs instead (gloo's all-reduce, then the reference add + RMSNorm,
through GroupCoordinator.all_reduce_add_rms_norm) at decode sizes, fp32 (the CPU dtype): a
stand-in, not a GPU figure.

NVLink multicast is off in every worker (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1), set before torch.distributed or symmetric memory start.

Checks (each fails the run): every rank's one-shot output agrees with the reference on all ranks'
partials (bf16 tolerance) and every rank holds the same bits; the same inside a CUDA graph replayed
with new inputs; the fp8 variant and the plain all-reduce; many back-to-back calls of different
sizes (a broken barrier shows as wrong sums or a hang, caught by the process-group timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # hotpath from this checkout

from hotpath.distributed.env import disable_multicast  # noqa: E402

disable_multicast()  # before torch.distributed, NCCL or symmetric memory read the environment

KIB = 1024
SIZES = [4 * KIB << i for i in range(15)]  # 4 KiB ... 64 MiB


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=None,
                    help="GPUs to spawn a worker on (default: all visible); ignored under torchrun")
    ap.add_argument("--hidden", type=int, default=4096, help="row width of the messages (bf16 elements)")
    ap.add_argument("--capacity-mib", type=int, default=16,
                    help="symmetric buffer a rank (MiB): the largest message the one-shot kernel is timed at")
    ap.add_argument("--iters", type=int, default=50, help="timed calls a measurement")
    ap.add_argument("--graph-calls", type=int, default=20, help="calls captured in one CUDA graph")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the JSON")
    ap.add_argument("--cpu", action="store_true", help="time the gloo path on the CPU instead (no GPU)")
    return ap.parse_args(argv)


def _shape(nbytes: int, hidden: int) -> tuple[int, int]:
    """[tokens, hidden] of a bf16 message of `nbytes` (narrower rows below one full row)."""
    elems = nbytes // 2
    return (1, elems) if elems < hidden else (elems // hidden, hidden)


def _partials(world: int, tokens: int, hidden: int, device, seed: int):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    xs = [torch.randn(tokens, hidden, generator=g, device=device).bfloat16() for _ in range(world)]
    residual = torch.randn(tokens, hidden, generator=g, device=device).bfloat16()  # [T, H]
    weight = (1 + 0.1 * torch.randn(hidden, generator=g, device=device)).bfloat16()  # [H]
    return xs, residual, weight


def _rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if out.isnan().any():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _same_on_all_ranks(t) -> bool:
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return all(torch.equal(p, parts[0]) for p in parts)


def check(peers, rank: int, world: int, device, hidden: int) -> list[str]:
    """The one-shot kernel against the reference, eager and in a graph; returns the failures."""
    import torch

    from hotpath.ops.allreduce import reference
    from hotpath.ops.allreduce import triton as one_shot
    from hotpath.ops.quant import fp8_dtype
    from hotpath.ops.quant import reference as quant_reference

    failures = []
    eps = 1e-6
    for tokens, h in ((1, hidden), (7, hidden), (64, hidden), (3, 1000), (1, 128)):
        if tokens * h * 2 > peers.capacity:
            continue
        for call in range(3):  # back to back, other values each call
            xs, residual, weight = _partials(world, tokens, h, device, seed=1000 * tokens + call)
            normed, summed = one_shot.all_reduce_add_rms_norm(xs[rank], residual, weight, eps, peers)
            want_normed, want_summed = reference.reduce_add_rms_norm(xs, residual, weight, eps)
            if _rel(summed, want_summed) > 1e-2 or _rel(normed, want_normed) > 2e-2:
                failures.append(f"norm [{tokens}, {h}] call {call}: {_rel(summed, want_summed):.3g}, "
                                f"{_rel(normed, want_normed):.3g}")
            if not (_same_on_all_ranks(summed) and _same_on_all_ranks(normed)):
                failures.append(f"norm [{tokens}, {h}]: ranks hold different bits")
        fp8 = fp8_dtype(device)
        q, scale, _ = one_shot.all_reduce_add_rms_norm_fp8(xs[rank], residual, weight, eps, peers, fp8)
        wq, wscale, _ = quant_reference.fused_add_rms_norm_fp8(reference.reduce_partials(xs), residual,
                                                                weight, eps, fp8)
        if _rel(q.float() * scale[:, None], wq.float() * wscale[:, None]) > 5e-2:
            failures.append(f"fp8 [{tokens}, {h}]")
        x = xs[rank].clone()
        one_shot.all_reduce(x, peers)
        if _rel(x, reference.reduce_partials(xs)) > 1e-2:
            failures.append(f"sum [{tokens}, {h}]")
    # inside a CUDA graph: captured once, replayed with new inputs copied into its static ones
    tokens = 8
    xs, residual, weight = _partials(world, tokens, hidden, device, seed=5)
    static_x, static_r = xs[rank].clone(), residual.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        one_shot.all_reduce_add_rms_norm(static_x, static_r, weight, eps, peers)  # compiled before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_normed, g_summed = one_shot.all_reduce_add_rms_norm(static_x, static_r, weight, eps, peers)
    for call in range(3):
        xs, residual, _ = _partials(world, tokens, hidden, device, seed=50 + call)
        static_x.copy_(xs[rank])
        static_r.copy_(residual)
        graph.replay()
        want_normed, want_summed = reference.reduce_add_rms_norm(xs, residual, weight, eps)
        if _rel(g_summed, want_summed) > 1e-2 or _rel(g_normed, want_normed) > 2e-2:
            failures.append(f"graph replay {call}")
    torch.cuda.synchronize()
    return failures


def _time(fn, iters: int) -> float:
    """Median microseconds of fn() (one call or one graph replay), by CUDA events."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def _graphed(fn, calls: int):
    """A CUDA graph of `calls` back-to-back fn() calls; returns its replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def measure(peers, group, rank: int, world: int, device, ns) -> list[dict]:
    import torch
    import torch.distributed as dist

    from hotpath.ops.allreduce import triton as one_shot
    from hotpath.ops.norm import fused_add_rms_norm

    rows = []
    for nbytes in SIZES:
        tokens, hidden = _shape(nbytes, ns.hidden)
        xs, residual, weight = _partials(1, tokens, hidden, device, seed=rank)
        x = xs[0]
        row = {"bytes": nbytes, "tokens": tokens, "hidden": hidden}

        def nccl():  # in place: x grows call after call, which changes nothing timed
            dist.all_reduce(x, group=group)
            return fused_add_rms_norm(x, residual, weight, 1e-6)

        def fused():
            return one_shot.all_reduce_add_rms_norm(x, residual, weight, 1e-6, peers)

        variants = {"nccl": nccl}
        if peers is not None and nbytes <= peers.capacity:
            variants["one_shot"] = fused
        for name, fn in variants.items():
            row[f"{name}_eager_us"] = round(_time(fn, ns.iters), 2)
            try:
                replay = _graphed(fn, ns.graph_calls)
                row[f"{name}_graph_us"] = round(_time(replay, ns.iters) / ns.graph_calls, 2)
            except Exception as e:  # noqa: BLE001 - reported, not fatal: the eager figure stands
                row[f"{name}_graph_us"] = None
                row[f"{name}_graph_error"] = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    return rows


def switch_point(rows: list[dict]) -> int | None:
    """The smallest size from which NCCL + norm is faster than the one-shot kernel in a graph at
    every larger size timed (None: the one-shot kernel won everywhere it was timed)."""
    timed = [r for r in rows if r.get("one_shot_graph_us") and r.get("nccl_graph_us")]
    switch = None
    for r in reversed(timed):
        if r["nccl_graph_us"] <= r["one_shot_graph_us"]:
            switch = r["bytes"]
        else:
            break
    return switch


def worker(local_rank: int, world: int, port: int | None, ns: argparse.Namespace) -> None:
    import torch

    from hotpath.distributed.init import destroy_distributed, init_distributed

    if port is None:  # torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR / PORT in the environment
        parallel = init_distributed(init_method="env://", backend="nccl", timeout_s=120,
                                    one_shot_capacity=ns.capacity_mib << 20, one_shot_max_bytes=1 << 62)
    else:
        parallel = init_distributed(local_rank, world, init_method=f"tcp://127.0.0.1:{port}", backend="nccl",
                                    local_rank=local_rank, timeout_s=120,
                                    one_shot_capacity=ns.capacity_mib << 20, one_shot_max_bytes=1 << 62)
    tp = parallel.tp
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        if tp.peers is None:
            raise RuntimeError("no symmetric-memory buffers: the one-shot kernel cannot run here "
                               "(see the warning above)")
        failures = check(tp.peers, tp.rank, tp.size, device, ns.hidden)
        if failures:
            raise AssertionError(f"rank {tp.rank}: " + "; ".join(failures))
        rows = measure(tp.peers, tp.group, tp.rank, tp.size, device, ns)
        if tp.rank == 0:
            result = {"world": tp.size, "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                      "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                             "NVSHMEM_DISABLE_NVLS")},
                      "switch_bytes": switch_point(rows), "rows": rows}
            out = Path(ns.out) / f"allreduce_fused_tp{tp.size}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
            print(f"checks passed on {tp.size} ranks; NCCL + norm wins from {result['switch_bytes']} bytes; "
                  f"wrote {out}", flush=True)
    finally:
        destroy_distributed(parallel)


CPU_SIZES = [4 * KIB << i for i in range(9)]  # 4 KiB ... 1 MiB: decode messages


def cpu_worker(rank: int, world: int, port: int, ns: argparse.Namespace) -> None:
    """Median microseconds a call of GroupCoordinator.all_reduce_add_rms_norm over gloo, fp32."""
    import time

    import torch

    from hotpath.distributed.init import destroy_distributed, init_distributed

    torch.set_num_threads(1)  # a worker a core, as the CPU workers run
    parallel = init_distributed(rank, world, init_method=f"tcp://127.0.0.1:{port}", backend="gloo", timeout_s=60)
    tp = parallel.tp
    rows = []
    try:
        for nbytes in CPU_SIZES:
            tokens, hidden = _shape(nbytes * 2 // 4, ns.hidden)  # fp32: half the elements of bf16
            g = torch.Generator().manual_seed(rank)
            x0 = torch.randn(tokens, hidden, generator=g)  # [T, H]
            residual, weight = torch.randn(tokens, hidden, generator=g), torch.randn(hidden, generator=g)
            x = x0.clone()
            times = []
            tp.barrier()
            for i in range(ns.iters + 5):
                x.copy_(x0)
                start = time.perf_counter()
                tp.all_reduce_add_rms_norm(x, residual, weight, 1e-6)
                if i >= 5:
                    times.append((time.perf_counter() - start) * 1e6)
            row = {"bytes": nbytes, "tokens": tokens, "hidden": hidden, "gloo_us": round(statistics.median(times), 1)}
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
        if rank == 0:
            out = Path(ns.out) / f"allreduce_gloo_cpu_tp{world}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"world": world, "torch": torch.__version__, "rows": rows}, indent=1))
            print(f"wrote {out}", flush=True)
    finally:
        destroy_distributed(parallel)


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        worker(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]), None, ns)
        return
    import torch
    import torch.multiprocessing as mp

    if ns.cpu:
        world = ns.nproc or 2
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(cpu_worker, args=(world, port, ns), nprocs=world, join=True)
        return
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs CUDA GPUs (the CPU stand-in is tests/distributed)")
    world = ns.nproc or torch.cuda.device_count()
    if not 2 <= world <= torch.cuda.device_count():
        raise SystemExit(f"--nproc {world}: needs 2 to {torch.cuda.device_count()} GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, ns), nprocs=world, join=True)


if __name__ == "__main__":
    main()
