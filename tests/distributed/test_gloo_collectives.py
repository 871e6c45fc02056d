"""GroupCoordinator's collectives over real gloo process groups: 2 and 4 processes on loopback, each
spawn running every case (process start-up is most of the time), checked against the
single-process reference on the same inputs. A world of 4 is also split into tp groups of 2
(dp = 2), to show that a tp collective stays inside its group."""

import socket

import pytest
import torch
import torch.multiprocessing as tmp

HIDDEN, TOKENS = 64, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(rank: int, dtype=torch.float32):
    """Rank `rank`'s partial, the residual and the norm weight (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(dtype)  # [T, H]
    g = torch.Generator().manual_seed(7)
    residual = torch.randn(TOKENS, HIDDEN, generator=g).to(dtype)  # [T, H]
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(dtype)  # [H]
    return x, residual, weight


def _close(out, want, tol):
    assert out.dtype == want.dtype and out.shape == want.shape, (out.dtype, want.dtype, out.shape, want.shape)
    err = float((out.double() - want.double()).norm() / want.double().norm())
    assert err < tol, err


def _check_group(coord, members: list[int], world_rank: int) -> None:
    """Every collective of `coord` (a group of the world ranks `members`) against the reference."""
    from hotpath.distributed.parallel_state import TORCH
    from hotpath.ops.allreduce import reference
    from hotpath.ops.quant import reference as quant_reference

    assert (coord.rank, coord.size) == (members.index(world_rank), len(members))
    x, residual, weight = _inputs(world_rank)
    assert coord.path(x) == TORCH
    parts = [_inputs(r)[0] for r in members]  # every member's partial, in group rank order
    # all_reduce, in place (gloo's sum order is its own: a tolerance, not bits)
    y = x.clone()
    assert coord.all_reduce(y) is y
    _close(y, reference.reduce_partials(parts), 1e-6)
    # bf16: the sum rounded to bf16 either way
    yb = x.bfloat16()
    coord.all_reduce(yb)
    _close(yb, reference.reduce_partials([p.bfloat16() for p in parts]), 1e-2)
    # all_gather along the last and the first dim
    assert torch.equal(coord.all_gather(x), torch.cat(parts, dim=-1))
    assert torch.equal(coord.all_gather(x, dim=0), torch.cat(parts, dim=0))
    # all-reduce + residual add + RMSNorm
    normed, summed = coord.all_reduce_add_rms_norm(x.clone(), residual, weight, 1e-6)
    want_normed, want_summed = reference.reduce_add_rms_norm(parts, residual, weight, 1e-6)
    _close(summed, want_summed, 1e-6)
    _close(normed, want_normed, 1e-5)
    # ... with the normed output quantized per token to fp8
    q, scale, summed = coord.all_reduce_add_rms_norm_fp8(x.clone(), residual, weight, 1e-6, torch.float8_e4m3fn)
    wq, wscale, _ = quant_reference.fused_add_rms_norm_fp8(reference.reduce_partials(parts), residual, weight,
                                                            1e-6, torch.float8_e4m3fn)
    _close(summed, want_summed, 1e-6)
    _close(q.float() * scale[:, None], wq.float() * wscale[:, None], 2e-2)


def _worker(rank: int, world: int, ports: list[int]) -> None:
    from hotpath.distributed.init import destroy_distributed, init_distributed

    parallel = init_distributed(rank, world, init_method=f"tcp://127.0.0.1:{ports[0]}", backend="gloo",
                                timeout_s=30)
    assert parallel.tp.peers is None and parallel.dp.size == 1
    _check_group(parallel.tp, list(range(world)), rank)
    destroy_distributed(parallel)
    if world == 4:  # tp groups {0, 1} and {2, 3}, dp groups {0, 2} and {1, 3}
        parallel = init_distributed(rank, world, init_method=f"tcp://127.0.0.1:{ports[1]}", backend="gloo",
                                    tp_size=2, timeout_s=30)
        tp_members = [0, 1] if rank < 2 else [2, 3]
        _check_group(parallel.tp, tp_members, rank)
        dp_members = [rank % 2, rank % 2 + 2]
        assert (parallel.dp.rank, parallel.dp.size) == (dp_members.index(rank), 2)
        y = _inputs(rank)[0]
        parallel.dp.all_reduce(y)
        _close(y, _inputs(dp_members[0])[0] + _inputs(dp_members[1])[0], 1e-6)
        destroy_distributed(parallel)


@pytest.mark.parametrize("world", [2, 4])
def test_collectives(world):
    # forked rather than spawned: a spawned child spends seconds importing torch again
    tmp.start_processes(_worker, args=(world, [_free_port(), _free_port()]), nprocs=world, join=True,
                        start_method="fork")
