"""The one-shot all-reduce kernel against its reference, N ranks simulated in one process under
the Triton interpreter: N peer buffers as CPU tensors, each rank's call reading all N.

The ranks run one after another, so the signal barriers are bypassed (sync=False): every rank
runs once to write its partial into its (NaN-poisoned) buffer, and the second round, which reads
every peer's partial, is checked. A rank that failed to write its partial leaves NaN in every
rank's output. The barriers themselves run in test_one_shot_protocol.py. Inputs are fp32 (the
interpreter computes bf16 wrongly without saying so).
"""

import pytest
import torch

from hotpath.ops.allreduce import make_local_peers
from hotpath.ops.allreduce import reference
from hotpath.ops.quant import reference as quant_reference


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "output holds NaN (a part the kernel did not write?)"
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def partials(world, tokens, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(tokens, hidden, generator=g) for _ in range(world)]  # world x [T, H]
    residual = torch.randn(tokens, hidden, generator=g)  # [T, H]
    weight = 1 + 0.1 * torch.randn(hidden, generator=g)  # [H]
    return xs, residual, weight


def run_ranks(fn, world, capacity):
    """fn(rank, peers) for every rank, twice (the first round fills the buffers); the second
    round's results."""
    peers = make_local_peers(world, capacity)
    for rank in range(world):
        fn(rank, peers[rank])
    return [fn(rank, peers[rank]) for rank in range(world)]


# 33 rows: more than the 32 programs a launch has at most, so two programs take two rows each
CASES = [(w, t, h) for w in (2, 4, 8) for t, h in ((1, 64), (5, 96))] + [(2, 33, 200), (4, 33, 200)]


@pytest.mark.parametrize("world,tokens,hidden", CASES)
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the first round reads poisoned peer buffers
def test_add_rms_norm(world, tokens, hidden, interpreter, poisoned):
    from hotpath.ops.allreduce import triton as kernels

    xs, residual, weight = partials(world, tokens, hidden, seed=world * 100 + tokens)
    got = run_ranks(lambda r, p: kernels.all_reduce_add_rms_norm(xs[r], residual, weight, 1e-6, p, sync=False),
                    world, capacity=tokens * hidden * 4)
    want_normed, want_summed = reference.reduce_add_rms_norm(xs, residual, weight, 1e-6)
    for normed, summed in got:
        assert rel_err(summed, want_summed) < 1e-6
        assert rel_err(normed, want_normed) < 1e-5
    # every rank holds the same bits: the residual stream must not drift apart across ranks
    for normed, summed in got[1:]:
        assert torch.equal(normed, got[0][0]) and torch.equal(summed, got[0][1])
    # and the reference over the same peer buffers agrees with it
    ref = run_ranks(lambda r, p: reference.all_reduce_add_rms_norm(xs[r], residual, weight, 1e-6, p), world,
                    capacity=tokens * hidden * 4)
    assert rel_err(got[0][0], ref[0][0]) < 1e-5 and torch.equal(got[0][1], ref[0][1])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_add_rms_norm_fp8(world, interpreter, poisoned):
    from hotpath.ops.allreduce import triton as kernels

    tokens, hidden = 6, 160
    xs, residual, weight = partials(world, tokens, hidden, seed=7)
    got = run_ranks(lambda r, p: kernels.all_reduce_add_rms_norm_fp8(xs[r], residual, weight, 1e-6, p,
                                                                     torch.float8_e4m3fn, sync=False),
                    world, capacity=tokens * hidden * 4)
    want_q, want_scale, want_summed = quant_reference.fused_add_rms_norm_fp8(
        reference.reduce_partials(xs), residual, weight, 1e-6, torch.float8_e4m3fn)
    for q, scale, summed in got:
        assert q.dtype == torch.float8_e4m3fn and q.shape == (tokens, hidden)
        assert rel_err(summed, want_summed) < 1e-6
        assert rel_err(scale, want_scale) < 1e-5
        dequant, want = q.float() * scale[:, None], want_q.float() * want_scale[:, None]
        assert rel_err(dequant, want) < 1e-2  # an fp8 step where a value sits on a rounding edge
        assert (q.float() == want_q.float()).float().mean() > 0.98


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("numel", [1, 100, 4096 * 2 + 17])
def test_all_reduce(world, numel, interpreter):
    """A plain in-place all-reduce: the flat message in rows of up to 4096, the last one partial."""
    from hotpath.ops.allreduce import triton as kernels

    g = torch.Generator().manual_seed(numel)
    xs = [torch.randn(numel, generator=g) for _ in range(world)]  # world x [numel]
    work = [[x.clone() for x in xs] for _ in range(2)]
    peers = make_local_peers(world, capacity=4 * numel + 64)
    for round_ in range(2):
        for rank in range(world):
            out = kernels.all_reduce(work[round_][rank], peers[rank], sync=False)
            assert out is work[round_][rank]
    want = reference.reduce_partials(xs)
    for rank in range(world):
        assert rel_err(work[1][rank], want) < 1e-6
    # beyond the message the buffers keep their NaN: the kernel writes only the message's bytes
    assert torch.isnan(peers[0].peer_view(0, torch.float32, numel + 16)[numel:]).all()


def test_rejects_what_does_not_fit(interpreter):
    from hotpath.ops.allreduce import triton as kernels

    peers = make_local_peers(2, capacity=256)
    x, residual, weight = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.all_reduce_add_rms_norm(x, residual, weight, 1e-6, peers[0], sync=False)
    with pytest.raises(ValueError, match="must be"):
        kernels.all_reduce_add_rms_norm(x[:1], residual[:1], torch.randn(16), 1e-6, peers[0], sync=False)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        kernels.all_reduce(torch.ones(4, dtype=torch.int32), peers[0], sync=False)
