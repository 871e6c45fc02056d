"""The one-shot all-reduce + residual add + RMSNorm, readably: what the Triton kernel computes,
with the same signature, and the plain reduction both are checked against.

The sum over ranks is taken in fp32 in rank order and rounded once to the input dtype, so every
rank gets the same bits (the residual stream must not drift apart across ranks); then the residual
add and the norm round where hotpath.ops.norm's reference rounds.

The peer-buffer functions read the other ranks' partials from `peers.buffers` (tensors this
process can address: the single-process simulation of a group). They do no synchronisation: the
caller runs each rank's call after every rank has written its partial (`sync` is accepted for
the kernel's signature and changes nothing).
"""

from __future__ import annotations

import torch

from hotpath.ops.allreduce.peers import PeerBuffers
from hotpath.ops.norm import reference as norm_reference


def reduce_partials(partials: list[torch.Tensor]) -> torch.Tensor:
    """sum(partials) in fp32 in list order, rounded to the partials' dtype."""
    total = torch.zeros(partials[0].shape, dtype=torch.float32, device=partials[0].device)
    for p in partials:
        total += p.float()
    return total.to(partials[0].dtype)


def reduce_add_rms_norm(
    partials: list[torch.Tensor],  # world x [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum(partials) + residual) * weight, sum(partials) + residual)."""
    return norm_reference.fused_add_rms_norm(reduce_partials(partials), residual, weight, eps)


def _exchange(x: torch.Tensor, peers: PeerBuffers) -> torch.Tensor:
    """Writes x into this rank's buffer and returns the reduction of every rank's buffer."""
    if not peers.fits(x):
        raise ValueError(f"{x.numel() * x.element_size()} bytes do not fit the {peers.capacity}-byte peer buffers")
    peers.peer_view(peers.rank, x.dtype, x.numel()).copy_(x.reshape(-1))
    partials = [peers.peer_view(p, x.dtype, x.numel()).view(x.shape) for p in range(peers.world)]
    return reduce_partials(partials)


def all_reduce(x: torch.Tensor, peers: PeerBuffers, *, sync: bool = True) -> torch.Tensor:
    """x <- the sum over ranks, in place; returns x."""
    return x.copy_(_exchange(x, peers))


def all_reduce_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] this rank's partial
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    peers: PeerBuffers,
    *,
    sync: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual)."""
    return norm_reference.fused_add_rms_norm(_exchange(x, peers), residual, weight, eps)


def all_reduce_add_rms_norm_fp8(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    peers: PeerBuffers,
    out_dtype: torch.dtype = torch.float8_e4m3fn,
    *,
    sync: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, H] fp8, [T] fp32, [T, H]
    """(per-token fp8 of the normed output, its scales, the new residual): the normed input of an
    fp8 linear, quantized in the same pass (hotpath.ops.quant's fused_add_rms_norm_fp8)."""
    from hotpath.ops.quant import reference as quant_reference

    return quant_reference.fused_add_rms_norm_fp8(_exchange(x, peers), residual, weight, eps, out_dtype)
