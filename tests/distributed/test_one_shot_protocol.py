"""The one-shot kernel's signal protocol, run for real: one forked process a rank, each running its
kernel under the Triton interpreter with the barriers on (sync=True), over peer buffers and signal
pads in shared memory (mapped at the same addresses in every fork). The interpreter's atomics are
real atomics on that memory, so a rank that reads before its peers have written, a barrier that
waits on the wrong flag, or a flag left set after a call shows up here as a wrong result, a hang
(caught by the timeout) or a non-zero pad.

What this cannot show: the memory ordering of a GPU (the interpreter runs a program's threads as
one, in order); benchmarks/allreduce_fused.py checks that on GPUs.
"""

import multiprocessing as mp

import pytest
import torch

from hotpath.ops.allreduce import make_local_peers
from hotpath.ops.allreduce import reference

CALLS = 3  # back to back, each with other values: a rank reading early sees the previous call's


def _rank(rank, peers, xs, residual, weight, outs, fp8_outs):
    from hotpath.ops.allreduce import triton as kernels

    for call in range(CALLS):
        normed, summed = kernels.all_reduce_add_rms_norm(xs[rank] * (call + 1), residual, weight, 1e-6, peers[rank])
        outs[rank][call].copy_(normed)
    # a plain all-reduce and the fp8 variant reuse the same pads after the calls above
    x = xs[rank].clone()
    kernels.all_reduce(x, peers[rank])
    fp8_outs[rank][0].copy_(x)
    q, scale, _ = kernels.all_reduce_add_rms_norm_fp8(xs[rank], residual, weight, 1e-6, peers[rank])
    fp8_outs[rank][1].copy_(q.float() * scale[:, None])


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_in_processes(world, interpreter):
    tokens, hidden = 3, 64
    g = torch.Generator().manual_seed(world)
    xs = [torch.randn(tokens, hidden, generator=g).share_memory_() for _ in range(world)]
    residual, weight = torch.randn(tokens, hidden, generator=g), 1 + 0.1 * torch.randn(hidden, generator=g)
    outs = [torch.full((CALLS, tokens, hidden), float("nan")).share_memory_() for _ in range(world)]
    fp8_outs = [torch.full((2, tokens, hidden), float("nan")).share_memory_() for _ in range(world)]
    peers = make_local_peers(world, capacity=tokens * hidden * 4, shared=True)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, peers, xs, residual, weight, outs, fp8_outs)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} never passed a barrier"
    assert [p.exitcode for p in procs] == [0] * world
    for call in range(CALLS):
        want, _ = reference.reduce_add_rms_norm([x * (call + 1) for x in xs], residual, weight, 1e-6)
        for r in range(world):
            err = (outs[r][call] - want).norm() / want.norm()
            assert err < 1e-5, (call, r, float(err))
    want_sum = reference.reduce_partials(xs)
    for r in range(world):
        assert torch.allclose(fp8_outs[r][0], want_sum, rtol=1e-6, atol=1e-6)
        assert torch.equal(fp8_outs[r][1], fp8_outs[0][1])  # every rank the same bits
    for pad in peers[0].signal_pads:  # every flag consumed: the next call starts clean
        assert not pad.any()
