"""Where data-parallel replicas run: GPU groups of tensor_parallel_size, CPU core shares, and clear
errors for a device that cannot hold them. No process is started."""

import pytest
import torch

from hotpath.args import EngineArgs
from hotpath.engine.dp_front import replica_environments


def gpus(monkeypatch, count: int, visible: str | None = None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def test_replica_i_sees_the_ith_group_of_tensor_parallel_gpus(monkeypatch):
    gpus(monkeypatch, 4)
    envs, groups = replica_environments(EngineArgs(device="auto", tensor_parallel_size=2), 2)
    assert groups == ["0,1", "2,3"] and envs == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]


def test_groups_are_taken_from_the_gpus_already_visible(monkeypatch):
    gpus(monkeypatch, 3, visible="5,6,7")
    _, groups = replica_environments(EngineArgs(device="cuda"), 3)
    assert groups == ["5", "6", "7"]


def test_too_few_gpus_and_a_single_gpu_device_are_refused(monkeypatch):
    gpus(monkeypatch, 2)
    with pytest.raises(ValueError, match="needs 4 GPUs; 2 visible"):
        replica_environments(EngineArgs(device="cuda", tensor_parallel_size=2), 2)
    with pytest.raises(ValueError, match="names one device"):
        replica_environments(EngineArgs(device="cuda:1"), 2)


def test_cpu_replicas_share_the_cores(monkeypatch):
    gpus(monkeypatch, 0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    envs, groups = replica_environments(EngineArgs(device="auto"), 4)
    assert groups is None and envs == [{"OMP_NUM_THREADS": "2"}] * 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stands
    assert replica_environments(EngineArgs(device="cpu"), 2) == ([{}, {}], None)
