"""Setting up and tearing down one worker's torch.distributed process groups.

A worker calls init_distributed once, before building its model: it joins the job's default
group (NCCL on CUDA, gloo on the CPU) through a `tcp://host:port` address or torchrun's `env://`
(MASTER_ADDR / MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), splits the world into tensor-parallel
groups of `tp_size` consecutive ranks (world = dp x tp; the ranks of one node form a tp group as
long as tp_size is at most the GPUs a node has), and returns the `Parallel` to build the model in.
On CUDA it pins the worker to its local GPU and gives the tp group symmetric-memory buffers for
the one-shot all-reduce. NVLink multicast is disabled first (hotpath.distributed.env).

Failures are raised as DistributedInitError naming the backend, the address, the rank and the
world size, with a hint, within the timeout rather than as a hang.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from hotpath.distributed.env import disable_multicast
from hotpath.distributed.parallel_state import ONE_SHOT_MAX_BYTES, SINGLE, GroupCoordinator, Parallel
from hotpath.distributed.symmetric import DEFAULT_CAPACITY, allocate_peer_buffers

log = logging.getLogger(__name__)

BACKENDS = ("nccl", "gloo")


class DistributedInitError(RuntimeError):
    """torch.distributed could not be set up for this worker (the message says where and why)."""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedInitError(f"environment variable {name}={value!r} is not an integer") from None


def _where(backend: str, init_method: str, rank: int, world_size: int) -> str:
    return f"backend {backend}, init_method {init_method}, rank {rank} of world size {world_size}"


def _check_address(init_method: str, backend: str, rank: int, world_size: int) -> None:
    """A tcp:// address must name a port and a host that resolves; env:// needs MASTER_ADDR and
    MASTER_PORT. Checked before torch is asked, so a typo fails at once, not at the timeout."""
    if init_method == "env://":
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(n)]
        if missing:
            raise DistributedInitError(
                f"init_method env:// needs {' and '.join(missing)} in the environment "
                f"({_where(backend, init_method, rank, world_size)}); torchrun sets them, or pass "
                f"init_method='tcp://HOST:PORT'")
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    elif init_method.startswith("tcp://"):
        parsed = urlparse(init_method)
        try:
            host, port = parsed.hostname, parsed.port
        except ValueError as e:  # urllib's "Port out of range" or a port that is not a number
            raise DistributedInitError(f"the port of {init_method!r} is not a port number (1-65535): {e}") from None
        if not host or port is None:
            raise DistributedInitError(f"init_method {init_method!r} must be tcp://HOST:PORT")
    else:
        raise DistributedInitError(f"init_method must be 'tcp://HOST:PORT' or 'env://', got {init_method!r}")
    try:
        port = int(port)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise DistributedInitError(f"port {port!r} of {init_method!r} is not a port number (1-65535)") from None
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise DistributedInitError(
            f"the master address {host!r} does not resolve ({e}; {_where(backend, init_method, rank, world_size)}): "
            f"use the IP address or host name of rank 0's node") from None


def _hint(error: Exception, init_method: str, timeout_s: float) -> str:
    text = str(error).lower()
    if "address already in use" in text or "eaddrinuse" in text or "errno: 98" in text:
        return ("another process holds the master port: pick a free port, or stop the process "
                "that holds it (an earlier job that did not exit?)")
    if "timeout" in text or "timed out" in text:
        return (f"no answer within {timeout_s:g} s: is rank 0 running and listening at this address, "
                "can this node reach it (firewall), and do all ranks pass the same address and world size?")
    if "nccl" in text:
        return ("NCCL failed to start: NCCL_DEBUG=INFO shows why (GPUs visible to each worker, "
                "the network interface NCCL picked: NCCL_SOCKET_IFNAME)")
    return "check that every rank uses the same init_method, world size and backend"


def _tp_groups(world_size: int, tp_size: int, backend: str) -> tuple[list, list]:
    """The tp groups (tp_size consecutive ranks each) and dp groups (the ranks sharing a tp rank),
    created on every rank in the same order, as dist.new_group requires."""
    dp_size = world_size // tp_size
    tp_ranks = [list(range(d * tp_size, (d + 1) * tp_size)) for d in range(dp_size)]
    dp_ranks = [list(range(t, world_size, tp_size)) for t in range(tp_size)]
    tp = [dist.group.WORLD if len(r) == world_size else dist.new_group(r, backend=backend) for r in tp_ranks]
    dp = [dist.group.WORLD if len(r) == world_size else dist.new_group(r, backend=backend) for r in dp_ranks]
    return list(zip(tp_ranks, tp)), list(zip(dp_ranks, dp))


def _coordinator(rank: int, members: list[tuple[list[int], object]], **kwargs) -> GroupCoordinator:
    ranks, group = next((r, g) for r, g in members if rank in r)
    if len(ranks) == 1:
        return GroupCoordinator()
    return GroupCoordinator(ranks.index(rank), len(ranks), group, **kwargs)


def init_distributed(
    rank: int | None = None,
    world_size: int | None = None,
    *,
    init_method: str = "env://",
    tp_size: int | None = None,
    backend: str | None = None,
    local_rank: int | None = None,
    timeout_s: float = 60.0,
    one_shot: bool = True,
    one_shot_capacity: int = DEFAULT_CAPACITY,
    one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES,
) -> Parallel:
    """Joins this worker to the job and returns the groups to build its model in.

    rank, world_size: this worker's; under env:// they default to RANK and WORLD_SIZE.
    tp_size: ranks a tensor-parallel group (default: the world); world_size must be a multiple.
    backend: "nccl" or "gloo" (default: nccl where CUDA is available, else gloo).
    local_rank: the GPU of this node the worker runs on (default: LOCAL_RANK, else rank modulo
    the visible GPUs).
    timeout_s: how long to wait for the other ranks at start-up and, afterwards, for any
    collective (torch's process-group timeout).
    one_shot: give the tp group symmetric-memory buffers of one_shot_capacity bytes for the
    one-shot all-reduce (CUDA only); messages up to one_shot_max_bytes take it.
    """
    disable_multicast()
    if init_method == "env://":
        rank = _env_int("RANK") if rank is None else rank
        world_size = _env_int("WORLD_SIZE") if world_size is None else world_size
        local_rank = _env_int("LOCAL_RANK") if local_rank is None else local_rank
    if rank is None or world_size is None:
        raise DistributedInitError(f"rank and world_size are needed (given {rank}, {world_size}); under "
                                   f"init_method env:// they come from RANK and WORLD_SIZE")
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedInitError(f"rank {rank} is not in [0, world size {world_size})")
    tp_size = world_size if tp_size is None else tp_size
    if tp_size < 1 or world_size % tp_size:
        raise DistributedInitError(f"tensor-parallel size {tp_size} does not divide the world size {world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in BACKENDS:
        raise DistributedInitError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if timeout_s <= 0:
        raise DistributedInitError(f"timeout_s must be positive, got {timeout_s}")
    if dist.is_initialized():
        raise DistributedInitError("torch.distributed is already initialised in this process: "
                                   "call destroy_distributed() first")
    _check_address(init_method, backend, rank, world_size)

    device = torch.device("cpu")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedInitError(f"backend nccl needs CUDA GPUs, and none is visible "
                                       f"({_where(backend, init_method, rank, world_size)}); use backend gloo on the CPU")
        gpus = torch.cuda.device_count()
        local_rank = rank % gpus if local_rank is None else local_rank
        if not 0 <= local_rank < gpus:
            raise DistributedInitError(f"local rank {local_rank} has no GPU: {gpus} visible on this node "
                                       f"({_where(backend, init_method, rank, world_size)}); more ranks than GPUs?")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)

    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - re-raised with where it happened and a hint
        raise DistributedInitError(
            f"torch.distributed failed to initialise ({_where(backend, init_method, rank, world_size)}): "
            f"{type(e).__name__}: {str(e).strip()[:500].rstrip('.')}. Hint: {_hint(e, init_method, timeout_s)}") from e

    try:
        tp_groups, dp_groups = _tp_groups(world_size, tp_size, backend)
        tp_ranks, tp_group = next((r, g) for r, g in tp_groups if rank in r)
        peers = None
        if one_shot and backend == "nccl" and tp_size > 1:
            peers = allocate_peer_buffers(tp_group, device, one_shot_capacity)
        tp = _coordinator(rank, tp_groups, peers=peers, one_shot_max_bytes=one_shot_max_bytes)
        dp = _coordinator(rank, dp_groups)
    except Exception:
        dist.destroy_process_group()
        raise
    log.info("rank %d of %d: tp rank %d of %d, dp rank %d of %d, %s on %s%s", rank, world_size, tp.rank,
             tp.size, dp.rank, dp.size, backend, device, ", one-shot all-reduce buffers" if peers else "")
    return Parallel(tp=tp, dp=dp)


def destroy_distributed(parallel: Parallel | None = None) -> None:
    """Releases this worker's groups (and the one-shot buffers, with `parallel`); safe to call
    twice or without init. Every rank calls it at shutdown."""
    if parallel is not None and parallel.tp.peers is not None:
        parallel.tp.peers = None  # the symmetric buffer and its mapping go with the last reference
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["DistributedInitError", "SINGLE", "destroy_distributed", "init_distributed"]
