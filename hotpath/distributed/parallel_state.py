"""The tensor-parallel group a model is built for, and the collectives its layers call.

A model is built inside `building_parallel(parallel)`: every parallel layer reads
`current_parallel()` as it is constructed and keeps the group, so it knows its full and local
sizes and does its own collectives; models never compute a shard (DESIGN.md). Outside any
`building_parallel` a layer sees the single-rank group, whose collectives do nothing.

Expert parallelism uses the tensor-parallel ranks (experts split across them instead of each
expert's width), as vLLM's `enable_expert_parallel` does without data-parallel attention.

Which implementation a collective takes (GroupCoordinator.path): one rank, none; CPU tensors (gloo),
torch's all-reduce and the reference norm; CUDA tensors of at most `one_shot_max_bytes` where the
group has symmetric-memory peer buffers (hotpath.distributed.symmetric) they fit, the one-shot
Triton kernel (hotpath/ops/allreduce), which fuses the residual add and the norm; otherwise NCCL and
the fused add + norm kernel. The choice depends only on the message's size, shape and device, so
every rank of a group takes the same path for the same call; neither path syncs with the host or
allocates outside torch's allocator, so both can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hotpath.ops.allreduce.peers import PeerBuffers

# Messages up to this many bytes take the one-shot kernel where the group has peer buffers; larger
# ones take NCCL, whose ring / tree algorithms win once bandwidth, not latency, decides. A start
# value until benchmarks/allreduce_fused.py measures the crossover on a multi-GPU machine.
ONE_SHOT_MAX_BYTES = 512 * 1024

LOCAL, TORCH, ONE_SHOT, NCCL = "local", "torch", "one_shot", "nccl"  # GroupCoordinator.path's answers


class GroupCoordinator:
    """One rank's view of a group of ranks: its index and size, and the collectives over it.
    `group` is None for the single-rank group (every collective is the identity). `peers`: the
    group's symmetric-memory buffers for the one-shot all-reduce (GPU groups), if it has them;
    messages of at most `one_shot_max_bytes` that fit them take it (see the module docstring)."""

    def __init__(
        self,
        rank: int = 0,
        size: int = 1,
        group: dist.ProcessGroup | None = None,
        *,
        peers: PeerBuffers | None = None,
        one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES,
    ) -> None:
        assert 0 <= rank < size and (group is not None or size == 1), (rank, size)
        assert peers is None or (peers.rank, peers.world) == (rank, size), (peers, rank, size)
        self.rank = rank
        self.size = size
        self.group = group
        self.peers = peers
        self.one_shot_max_bytes = one_shot_max_bytes

    def path(self, x: torch.Tensor, fused_norm: bool = False) -> str:
        """Which implementation a collective on `x` takes: LOCAL (one rank), TORCH (CPU tensors:
        torch.distributed, gloo), ONE_SHOT (the symmetric-memory kernel) or NCCL."""
        from hotpath.ops import backend
        from hotpath.ops.allreduce.peers import one_shot_fits

        if self.size == 1:
            return LOCAL
        if not x.is_cuda:
            return TORCH
        if (self.peers is not None and x.numel() * x.element_size() <= self.one_shot_max_bytes
                and one_shot_fits(x, self.peers, fused_norm) and backend.use_triton(x)):
            return ONE_SHOT
        return NCCL

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place; returns x."""
        path = self.path(x)
        if path == ONE_SHOT:
            from hotpath.ops.allreduce import triton as one_shot

            return one_shot.all_reduce(x, self.peers)
        if path != LOCAL:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's x concatenated along `dim`, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def all_reduce_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual): a row-parallel
        layer's partial output reduced, added into the residual stream and normalised for the next
        sublayer. x is consumed: the NCCL and gloo paths reduce into it in place."""
        from hotpath.ops.norm import fused_add_rms_norm

        path = self.path(x, fused_norm=True)
        if path == ONE_SHOT:
            from hotpath.ops.allreduce import triton as one_shot

            return one_shot.all_reduce_add_rms_norm(x, residual, weight, eps, self.peers)
        if path != LOCAL:
            dist.all_reduce(x, group=self.group)
        return fused_add_rms_norm(x, residual, weight, eps)

    def all_reduce_add_rms_norm_fp8(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, H] fp8, [T] fp32, [T, H]
        """all_reduce_add_rms_norm with the normed output quantized per token to fp8 (the input of
        an fp8 linear): (its fp8, its scales, the new residual), as
        hotpath.ops.quant.fused_add_rms_norm_fp8 returns them."""
        from hotpath.ops.quant import fp8_dtype, fused_add_rms_norm_fp8

        out_dtype = out_dtype or fp8_dtype(x.device)
        path = self.path(x, fused_norm=True)
        if path == ONE_SHOT:
            from hotpath.ops.allreduce import triton as one_shot

            return one_shot.all_reduce_add_rms_norm_fp8(x, residual, weight, eps, self.peers, out_dtype)
        if path != LOCAL:
            dist.all_reduce(x, group=self.group)
        return fused_add_rms_norm_fp8(x, residual, weight, eps, out_dtype)

    def barrier(self) -> None:
        """Every rank of the group reaches this point (host side; not for CUDA graphs)."""
        if self.size > 1:
            dist.barrier(group=self.group)


@dataclass(frozen=True)
class Parallel:
    """What a layer needs to know about the ranks it runs on."""

    tp: GroupCoordinator
    expert_parallel: bool = False  # MoE experts split across the tp ranks, not their width
    # the ranks holding the same tp rank of each data-parallel replica (world = dp x tp)
    dp: GroupCoordinator = field(default_factory=GroupCoordinator)


SINGLE = Parallel(GroupCoordinator())

_building: ContextVar[Parallel] = ContextVar("hotpath_parallel", default=SINGLE)


@contextmanager
def building_parallel(parallel: Parallel) -> Iterator[None]:
    """Layers built inside are this rank's shard of `parallel`'s groups."""
    token = _building.set(parallel)
    try:
        yield
    finally:
        _building.reset(token)


def current_parallel() -> Parallel:
    return _building.get()


def shard_range(total: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank's part of `total` items split as evenly as possible over `size`
    ranks, the first `total % size` ranks taking one more."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)
