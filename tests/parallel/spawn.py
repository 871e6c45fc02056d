"""Runs a test file's tensor-parallel cases in real gloo process groups on loopback.

Spawning processes and forming groups costs seconds, so a file spawns once: `run_cases` starts
`world_size` processes, each forms the group of all of them (tp = world_size) and, inside it, a
group of ranks 0 and 1 (tp = 2; the other ranks wait out its cases), then runs every case of the
file on each rank of its group. A case is `case(tp, *args)`, a module-level function taking this
rank's GroupCoordinator and the file's `args` (e.g. checkpoint paths, or reference outputs the
test process computed once); it raises to fail. The outcome per case is returned to the test
process ({name: None, or the first failing rank's traceback}), so a fixture runs them once and
each test reports its own case.
"""

from __future__ import annotations

import importlib
import json
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hotpath.distributed.parallel_state import GroupCoordinator, Parallel, building_parallel

Case = Callable[[GroupCoordinator], None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parallel(tp: GroupCoordinator):
    """The context a model or layer is built in for `tp` (building_parallel)."""
    return building_parallel(Parallel(tp))


def run_cases(module: str, cases: dict[str, tuple[str, int]], world_size: int = 4,
              timeout: float = 120.0, args: tuple = ()) -> dict[str, str | None]:
    """Runs each case {name: (function name in `module`, tp size 2 or world_size)} on every rank
    of its group; returns {name: None if it passed on every rank, else an error's traceback}."""
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        ctx = mp.spawn(_worker, args=(world_size, port, module, cases, out, args), nprocs=world_size,
                       join=False)
        deadline = time.monotonic() + timeout
        while not ctx.join(1):  # raises if a process died
            if time.monotonic() > deadline:
                for process in ctx.processes:
                    process.kill()
                raise TimeoutError(f"{module}'s cases did not finish in {timeout} s")
        results: dict[str, str | None] = {name: None for name in cases}
        for rank in range(world_size):
            path = Path(out) / f"{rank}.json"
            if not path.exists():
                raise RuntimeError(f"rank {rank} wrote no results")
            for name, error in json.loads(path.read_text()).items():
                if error is not None and results.get(name) is None:
                    results[name] = f"rank {rank}: {error}"
        return results


def _worker(rank: int, world_size: int, port: int, module: str, cases: dict[str, tuple[str, int]],
            out: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        groups = {world_size: GroupCoordinator(rank, world_size, dist.group.WORLD)}
        if world_size > 2:
            group = dist.new_group([0, 1])  # every rank takes part in creating it
            if rank < 2:
                groups[2] = GroupCoordinator(rank, 2, group)
        mod = importlib.import_module(module)
        results: dict[str, str | None] = {}
        for name, (func, size) in cases.items():
            torch.manual_seed(0)
            if size not in groups:
                results[name] = None
                dist.barrier()
                continue
            try:
                getattr(mod, func)(groups[size], *args)
                results[name] = None
            except (Exception, AssertionError, pytest.fail.Exception):  # reported per case
                results[name] = traceback.format_exc(limit=6)
            dist.barrier()
        (Path(out) / f"{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()
