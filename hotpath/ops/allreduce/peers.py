"""The peer buffers a one-shot all-reduce reads: one symmetric buffer and one signal pad a rank,
addressed by raw pointer, plus (where the process can see them) the buffers as tensors.

The kernel and its reference take the same `PeerBuffers`; on a GPU group it is built from torch's
symmetric memory (hotpath.distributed.symmetric), and in the single-process tests from plain CPU
tensors standing in for the ranks' buffers (see make_local_peers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Programs a one-shot launch uses at most: each does its own barrier with the peers, so the signal
# pad holds 2 barriers x MAX_PROGRAMS x world flags a rank.
MAX_PROGRAMS = 32
BARRIERS = 2  # start (peers done with the previous call) and mid (peers' partials written)
MAX_HIDDEN = 16384  # a row is held in registers, as the norm kernels hold it
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def signal_pad_words(world: int) -> int:
    """uint32 flags a rank's signal pad needs for `world` ranks."""
    return BARRIERS * MAX_PROGRAMS * world


@dataclass(frozen=True)
class PeerBuffers:
    """One rank's handles on the group's symmetric buffers."""

    rank: int
    world: int
    buffer_ptrs: torch.Tensor  # [world] int64, each rank's buffer address, on the kernel's device
    signal_ptrs: torch.Tensor  # [world] int64, each rank's signal pad (uint32 flags) address
    capacity: int  # bytes of each rank's buffer
    buffers: tuple[torch.Tensor, ...] = ()  # [world] uint8 [capacity] views, where addressable
    signal_pads: tuple[torch.Tensor, ...] = ()  # [world] int32 flags, where addressable
    # what the addresses stay valid for as long as it lives (symmetric memory's buffer and handle)
    keep_alive: tuple = field(default=(), repr=False, compare=False)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether x's bytes fit a buffer (a message that does not takes the NCCL path)."""
        return x.numel() * x.element_size() <= self.capacity

    def peer_view(self, peer: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The first `numel` elements of `peer`'s buffer as `dtype` (reference and tests only)."""
        if not self.buffers:
            raise RuntimeError("these peer buffers are not addressable as tensors from this process")
        return self.buffers[peer][: numel * torch.empty(0, dtype=dtype).element_size()].view(dtype)


def one_shot_fits(x: torch.Tensor, peers: PeerBuffers, fused_norm: bool) -> bool:
    """Whether the one-shot kernel takes `x` (the all-reduce + norm's [tokens, hidden] partial
    with `fused_norm`, else a plain all-reduce's in-place message) on these peer buffers."""
    if x.dtype not in DTYPES or not peers.fits(x) or x.device != peers.buffer_ptrs.device:
        return False
    if fused_norm:
        return x.dim() == 2 and x.shape[-1] <= MAX_HIDDEN
    return x.is_contiguous()


def make_local_peers(world: int, capacity: int, shared: bool = False) -> list[PeerBuffers]:
    """`world` ranks' PeerBuffers over CPU buffers and signal pads allocated in this process: the
    single-process stand-in for a group, for the interpreter tests. Buffers start as NaN (poisoned)
    and signal pads as zero, as torch's symmetric memory leaves them. `shared`: in shared memory,
    so that processes forked afterwards see the same bytes at the same addresses."""
    if world < 1 or capacity < 4 or capacity % 4:
        raise ValueError(f"world must be >= 1 and capacity a positive multiple of 4, got {world}, {capacity}")
    buffers = [torch.full((capacity // 4,), float("nan")) for _ in range(world)]  # [capacity / 4] fp32
    pads = [torch.zeros(signal_pad_words(world), dtype=torch.int32) for _ in range(world)]  # flags
    if shared:
        buffers = [b.share_memory_() for b in buffers]
        pads = [p.share_memory_() for p in pads]
    views = tuple(b.view(torch.uint8) for b in buffers)  # [capacity]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in views], dtype=torch.int64)  # [world]
    signal_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)  # [world]
    return [PeerBuffers(r, world, buffer_ptrs, signal_ptrs, capacity, views, tuple(pads)) for r in range(world)]
