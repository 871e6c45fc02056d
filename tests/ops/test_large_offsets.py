"""Kernels at element offsets past 2**31: a KV cache whose sequences live in blocks beyond the first
2**31 elements of each cache tensor, and weights with more than 2**31 elements read at their last
rows. A kernel that computes any of these offsets in 32 bits reads or writes the wrong place (or
faults; under compute-sanitizer, an invalid access). Each kernel is checked against its reference
on the same tensors. GPU only (each cache tensor is 4.3 GB)."""

import pytest
import torch

from ops_cases import TOL, cos_sin, cuda, rel_err

pytestmark = cuda

BIG = 2**31
KV_HEADS, HEAD_DIM, BLOCK_SIZE, GROUP = 8, 128, 16, 4


@pytest.fixture(scope="module")
def high_cache():
    """(k_cache, v_cache, first high block): blocks from `top` on start past 2**31 elements."""
    top = BIG // (BLOCK_SIZE * KV_HEADS * HEAD_DIM)
    shape = (top + 512, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    k_cache[top:].normal_()
    v_cache[top:].normal_()
    yield k_cache, v_cache, top
    del k_cache, v_cache
    torch.cuda.empty_cache()


def tables(ctxs: list[int], top: int, num_blocks: int) -> torch.Tensor:
    """Block tables whose blocks are scattered over the high blocks only."""
    need = [-(-c // BLOCK_SIZE) for c in ctxs]
    order = (torch.randperm(num_blocks - top, generator=torch.Generator().manual_seed(3)) + top).tolist()
    table = torch.full((len(ctxs), max(need)), top, dtype=torch.int32)
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    return table.cuda()


@pytest.mark.parametrize("qlens", [[1, 1, 1, 1], [100, 64, 33, 200], [1, 3, 1, 8]],
                         ids=["decode", "prefill", "verify"])
def test_attention_over_high_blocks(high_cache, qlens, gpu_triton):
    from hotpath.ops.attention import paged_attention, reference

    k_cache, v_cache, top = high_cache
    ctxs = [1500, 700, 33, 1024]
    table = tables(ctxs, top, k_cache.shape[0])
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ctx = torch.tensor(ctxs, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(qlens), KV_HEADS * GROUP, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    args = (q, k_cache, v_cache, cu, ctx, table, HEAD_DIM**-0.5, max(qlens), max(ctxs))
    assert rel_err(paged_attention(*args), reference.paged_attention(*args)) < TOL[torch.bfloat16]


def test_rope_cache_writes_to_high_blocks(high_cache, gpu_triton):
    """The fused decode kernel and qk_norm_rope_and_cache write this step's K/V at slots past
    2**31 elements: the rows they write equal the reference's, and the outputs agree."""
    from hotpath.ops.attention import reference, rope_and_paged_attention
    from hotpath.ops.rotary import reference as rotary_reference

    k_cache, v_cache, top = high_cache
    for qlens, ctxs in (([1, 1, 1], [900, 17, 1601]), ([40, 100, 9], [900, 117, 1601])):
        table = tables(ctxs, top, k_cache.shape[0])
        positions = torch.cat([torch.arange(c - n, c) for n, c in zip(qlens, ctxs)]).cuda()
        seq_of = torch.cat([torch.full((n,), i) for i, n in enumerate(qlens)]).cuda()
        slots = table[seq_of, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
        n = sum(qlens)
        q = torch.randn(n, KV_HEADS * GROUP, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        norms = [(1 + 0.2 * torch.randn(HEAD_DIM, device="cuda")).bfloat16() for _ in range(2)]
        table_cs = cos_sin(4096, HEAD_DIM, "cuda")
        cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        ctx = torch.tensor(ctxs, dtype=torch.int32, device="cuda")
        blocks, rows = slots // BLOCK_SIZE, slots % BLOCK_SIZE
        got = rope_and_paged_attention(q, k, v, positions, table_cs, k_cache, v_cache, slots, *norms, 1e-6,
                                       cu, ctx, table, HEAD_DIM**-0.5, max(qlens), max(ctxs))
        got_k, got_v = k_cache[blocks, rows].clone(), v_cache[blocks, rows].clone()
        k_cache[blocks, rows] = float("nan")  # the reference must write every one of them again
        v_cache[blocks, rows] = float("nan")
        q_rot = rotary_reference.qk_norm_rope_and_cache(q, k, v, positions, table_cs, k_cache, v_cache,
                                                        slots, *norms, 1e-6)
        want = reference.paged_attention(q_rot, k_cache, v_cache, cu, ctx, table, HEAD_DIM**-0.5,
                                         max(qlens), max(ctxs))
        assert rel_err(got, want) < TOL[torch.bfloat16]
        assert rel_err(got_k, k_cache[blocks, rows]) < TOL[torch.bfloat16] / 4
        assert torch.equal(got_v, v_cache[blocks, rows])


@pytest.fixture(scope="module")
def big_weight():
    """A [540000, 4096] weight (2.2e9 elements): random in its rows past 2**31 / 4096 = 524288."""
    weight = torch.zeros(540_000, 4096, dtype=torch.bfloat16, device="cuda")
    weight[-70_000:].normal_(std=0.02)
    yield weight
    del weight
    torch.cuda.empty_cache()


@pytest.mark.parametrize("rows", [1, 2, 16])
def test_gemv_past_2_31_weight_elements(big_weight, rows, gpu_triton):
    """One row runs the GEMV kernel at any weight size; several rows take it only on weights of
    at most 2**24 elements (ops/linear), so cuBLAS serves them here: either way, the last rows."""
    from hotpath.ops.linear import MULTI_ROW_MAX_WEIGHT_ELEMENTS, linear, use_gemv

    x = torch.randn(rows, big_weight.shape[1], dtype=torch.bfloat16, device="cuda")
    assert use_gemv(x, big_weight) == (rows == 1)
    assert MULTI_ROW_MAX_WEIGHT_ELEMENTS < BIG
    got = linear(x, big_weight)[:, -70_000:].float()
    want = x.float() @ big_weight[-70_000:].float().T
    assert rel_err(got, want) < TOL[torch.bfloat16]


def test_embedding_past_2_31_weight_elements(big_weight, gpu_triton):
    from hotpath.ops.embedding import embedding_with_sumsq

    n = big_weight.shape[0]
    ids = torch.tensor([n - 1, 530_000, 524_288, 3] + [n - 2] * 12, device="cuda")
    emb, sumsq = embedding_with_sumsq(ids, big_weight)
    assert torch.equal(emb, big_weight[ids])
    assert rel_err(sumsq.flatten(), big_weight[ids].float().pow(2).sum(-1)) < 1e-5
