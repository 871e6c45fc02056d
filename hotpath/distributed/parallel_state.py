"""The tensor-parallel group a model is built for, and the collectives its layers call.

A model is built inside `building_parallel(parallel)`: every parallel layer reads
`current_parallel()` as it is constructed and keeps the group, so it knows its full and local
sizes and does its own collectives; models never compute a shard (DESIGN.md). Outside any
`building_parallel` a layer sees the single-rank group, whose collectives do nothing.

Expert parallelism uses the tensor-parallel ranks (experts split across them instead of each
expert's width), as vLLM's `enable_expert_parallel` does without data-parallel attention.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist


class GroupCoordinator:
    """One rank's view of a group of ranks: its index and size, and the collectives over it.
    `group` is None for the single-rank group (every collective is the identity)."""

    def __init__(self, rank: int = 0, size: int = 1, group: dist.ProcessGroup | None = None) -> None:
        assert 0 <= rank < size and (group is not None or size == 1), (rank, size)
        self.rank = rank
        self.size = size
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place; returns x."""
        if self.size > 1:
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
        sublayer."""
        from hotpath.ops.norm import fused_add_rms_norm

        return fused_add_rms_norm(self.all_reduce(x), residual, weight, eps)


@dataclass(frozen=True)
class Parallel:
    """What a layer needs to know about the ranks it runs on."""

    tp: GroupCoordinator
    expert_parallel: bool = False  # MoE experts split across the tp ranks, not their width


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
