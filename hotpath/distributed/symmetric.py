"""The symmetric-memory buffers of a GPU group's one-shot all-reduce, allocated once at start-up.

Every rank allocates one buffer of `capacity` bytes with torch's symmetric memory
(torch.distributed._symmetric_memory: `empty`, then the collective `rendezvous`, which maps every
peer's buffer into this process and gives each buffer a zeroed signal pad). The peers' buffer and
signal-pad addresses go into two small device tensors that the kernel reads; nothing is allocated
per call, so the kernel can be captured in a CUDA graph.

Any failure (no CUDA, no peer access between the GPUs, a torch without symmetric memory, a signal
pad too small) leaves the group without one-shot buffers: its all-reduces take NCCL.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from hotpath.distributed.env import disable_multicast
from hotpath.ops.allreduce.peers import PeerBuffers, signal_pad_words

log = logging.getLogger(__name__)

# Bytes a rank's buffer holds: the largest decode message (tokens x hidden x element size) that
# takes the one-shot kernel. A larger message takes NCCL (see parallel_state.ONE_SHOT_MAX_BYTES).
DEFAULT_CAPACITY = 1 << 20


def allocate_peer_buffers(
    group: dist.ProcessGroup, device: torch.device, capacity: int = DEFAULT_CAPACITY
) -> PeerBuffers | None:
    """This rank's PeerBuffers over a symmetric buffer of `capacity` bytes on `device`, or None
    where the group cannot have them (logged). Collective: every rank of `group` calls it."""
    if device.type != "cuda":
        return None
    disable_multicast()
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # a no-op or gone in newer torch
            try:
                symm_mem.enable_symm_mem_for_group(group.group_name)
            except Exception:  # noqa: BLE001 - newer torch rendezvouses without it
                pass
        buffer = symm_mem.empty(capacity, dtype=torch.uint8, device=device)  # [capacity]
        handle = symm_mem.rendezvous(buffer, group)
        world = handle.world_size
        if handle.signal_pad_size < 4 * signal_pad_words(world):
            raise RuntimeError(f"symmetric memory's signal pad holds {handle.signal_pad_size} bytes, "
                               f"the one-shot kernel needs {4 * signal_pad_words(world)}")
        buffer_ptrs = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)  # [world]
        signal_ptrs = torch.tensor(list(handle.signal_pad_ptrs), dtype=torch.int64, device=device)  # [world]
        views = tuple(handle.get_buffer(p, (capacity,), torch.uint8) for p in range(world))
        # every rank's pad zeroed and mapped before any kernel signals; a host barrier, not
        # handle.barrier(), which would use (and could leave flags in) the pad the kernel owns
        torch.cuda.synchronize(device)
        dist.barrier(group=group)
    except Exception as e:  # noqa: BLE001 - any failure means NCCL only, not a failed start
        log.warning("no symmetric-memory buffers for the one-shot all-reduce (%s: %s); "
                    "all-reduces take NCCL", type(e).__name__, e)
        return None
    return PeerBuffers(handle.rank, world, buffer_ptrs, signal_ptrs, capacity, views, keep_alive=(buffer, handle))
