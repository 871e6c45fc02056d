"""On a machine with 2+ GPUs (skipped elsewhere): the one-shot kernel through GroupCoordinator over
real NCCL groups with symmetric memory, checked against the reference by the GPU benchmark's own
checks (eager, CUDA graph, fp8, plain sum), and the coordinator's choice of path by message size,
with each path's result checked, inside a CUDA graph too."""

import importlib.util
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as tmp

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 2, reason="needs 2 or more CUDA GPUs")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "allreduce_fused.py"


def _bench():
    spec = importlib.util.spec_from_file_location("allreduce_fused", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker(rank: int, world: int, port: int) -> None:
    from hotpath.distributed.init import destroy_distributed, init_distributed
    from hotpath.distributed.parallel_state import NCCL, ONE_SHOT
    from hotpath.ops.allreduce import reference

    bench = _bench()
    parallel = init_distributed(rank, world, init_method=f"tcp://127.0.0.1:{port}", backend="nccl",
                                timeout_s=60, one_shot_capacity=1 << 20, one_shot_max_bytes=256 << 10)
    tp = parallel.tp
    try:
        assert tp.peers is not None, "no symmetric-memory buffers"
        device = torch.device("cuda", torch.cuda.current_device())
        failures = bench.check(tp.peers, tp.rank, tp.size, device, 4096)
        assert not failures, failures
        for tokens, path in ((4, ONE_SHOT), (64, NCCL)):  # 32 KiB, 512 KiB of bf16
            xs, residual, weight = bench._partials(world, tokens, 4096, device, seed=tokens)
            assert tp.path(xs[rank], fused_norm=True) == path
            want_normed, want_summed = reference.reduce_add_rms_norm(xs, residual, weight, 1e-6)
            normed, summed = tp.all_reduce_add_rms_norm(xs[rank].clone(), residual, weight, 1e-6)
            assert bench._rel(summed, want_summed) < 1e-2 and bench._rel(normed, want_normed) < 2e-2, path
            static_x, outs = xs[rank].clone(), {}

            def step():
                outs["normed"], outs["summed"] = tp.all_reduce_add_rms_norm(static_x, residual, weight, 1e-6)

            replay = bench._graphed(step, 1)  # outs now hold the graph's outputs
            xs, residual_new, _ = bench._partials(world, tokens, 4096, device, seed=tokens + 1)
            static_x.copy_(xs[rank])
            residual.copy_(residual_new)
            replay()
            want_normed, want_summed = reference.reduce_add_rms_norm(xs, residual, weight, 1e-6)
            assert bench._rel(outs["summed"], want_summed) < 1e-2, (path, "graph")
            assert bench._rel(outs["normed"], want_normed) < 2e-2, (path, "graph")
        # a plain all-reduce of a small message takes the one-shot kernel too
        ys = [torch.randn(1000, generator=torch.Generator(device=device).manual_seed(100 + r), device=device)
              for r in range(world)]
        y = ys[rank].clone()
        assert tp.path(y) == ONE_SHOT
        assert tp.all_reduce(y) is y
        assert bench._rel(y, reference.reduce_partials(ys)) < 1e-5
    finally:
        destroy_distributed(parallel)


@pytest.mark.parametrize("world", sorted({2, min(GPUS, 8)}) if GPUS >= 2 else [2])
def test_one_shot_on_gpus(world):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.spawn(_worker, args=(world, port), nprocs=world, join=True)
