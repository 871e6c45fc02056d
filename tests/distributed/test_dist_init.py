"""init_distributed's failures: a clear DistributedInitError (backend, address, rank, world size
and a hint) within seconds, never a hang; and NVLink multicast forced off in the environment."""

import logging
import os
import socket
import time

import pytest
import torch.distributed as dist

from hotpath.distributed.env import NO_MULTICAST, disable_multicast
from hotpath.distributed.init import DistributedInitError, init_distributed


def _fails(match: str, seconds: float, **kwargs) -> str:
    start = time.monotonic()
    with pytest.raises(DistributedInitError, match=match) as info:
        init_distributed(backend="gloo", **kwargs)
    assert time.monotonic() - start < seconds
    assert not dist.is_initialized()
    return str(info.value)


def test_port_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        msg = _fails("address already in use", 5, rank=0, world_size=2,
                     init_method=f"tcp://127.0.0.1:{port}", timeout_s=3)
    for part in ("backend gloo", f"tcp://127.0.0.1:{port}", "rank 0 of world size 2", "Hint: another process"):
        assert part in msg, msg


def test_no_master_times_out():
    """Rank 1 waits for a rank 0 that never comes: the timeout, then the error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed, and nobody listens there
    msg = _fails("timed out", 10, rank=1, world_size=2, init_method=f"tcp://127.0.0.1:{port}", timeout_s=2)
    assert "rank 1 of world size 2" in msg and "is rank 0 running" in msg, msg


def test_bad_addresses():
    _fails("does not resolve", 5, rank=0, world_size=2, init_method="tcp://no-such-host.invalid:29500")
    _fails("not a port number", 1, rank=0, world_size=2, init_method="tcp://127.0.0.1:99999")
    _fails("must be tcp://HOST:PORT", 1, rank=0, world_size=2, init_method="tcp://127.0.0.1")
    _fails("must be 'tcp://HOST:PORT' or 'env://'", 1, rank=0, world_size=2, init_method="file:///tmp/x")


def test_bad_sizes(monkeypatch):
    _fails("does not divide", 1, rank=0, world_size=4, tp_size=3, init_method="tcp://127.0.0.1:29500")
    _fails(r"rank 2 is not in \[0, world size 2\)", 1, rank=2, world_size=2, init_method="tcp://127.0.0.1:29500")
    with pytest.raises(DistributedInitError, match="backend must be one of nccl, gloo"):
        init_distributed(0, 1, init_method="tcp://127.0.0.1:29500", backend="mpi")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    _fails("RANK and WORLD_SIZE", 1, init_method="env://")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _fails("needs MASTER_ADDR and MASTER_PORT", 1, init_method="env://")
    monkeypatch.setenv("WORLD_SIZE", "two")
    _fails("WORLD_SIZE='two' is not an integer", 1, init_method="env://")


def test_env_init_single_rank(monkeypatch):
    """env:// as torchrun sets it up, one rank: the world's single group, and a clean shutdown."""
    from hotpath.distributed.init import destroy_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(name, value)
    parallel = init_distributed(backend="gloo", timeout_s=10)
    try:
        assert (parallel.tp.size, parallel.dp.size) == (1, 1) and dist.is_initialized()
    finally:
        destroy_distributed(parallel)
    assert not dist.is_initialized()
    destroy_distributed(parallel)  # twice is fine


def test_multicast_forced_off(monkeypatch, caplog):
    environ = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    with caplog.at_level(logging.WARNING, logger="hotpath.distributed.env"):
        disable_multicast(environ)
    assert environ == NO_MULTICAST
    assert "NCCL_NVLS_ENABLE=1 would enable NVLink multicast" in caplog.text
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST" not in caplog.text  # already off: no warning
    # init sets them in the process environment before anything else, even when it then fails
    for name in NO_MULTICAST:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    _fails("does not divide", 1, rank=0, world_size=4, tp_size=3, init_method="tcp://127.0.0.1:29500")
    assert {name: os.environ.get(name) for name in NO_MULTICAST} == NO_MULTICAST
