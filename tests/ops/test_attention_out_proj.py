"""One-token decode attention with its context splits left unmerged, and the output projection
that merges them (triton_out_proj), against the reference: rotary + attention, then o_proj."""

import pytest
import torch

from hotpath.ops import attention, backend
from hotpath.ops.attention import reference
from ops_cases import TOL, cos_sin, cuda, paged_batch, rel_err


def one_token_inputs(ctx, group, num_kv_heads, head_dim, rotary_dim, hidden, qk_norm, dtype,
                     device, block_size):
    """A one-token decode at a `ctx`-token context: the batch, raw k/v of the new token, its
    position and cache slot, the RoPE table, QK-norm weights and an o_proj weight."""
    b = paged_batch([1], [ctx], num_heads=group * num_kv_heads, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, block_size=block_size, dtype=dtype, device=device, seed=ctx)
    g = torch.Generator().manual_seed(ctx + group)
    k_new = torch.randn(1, num_kv_heads, head_dim, generator=g).to(device, dtype)
    v_new = torch.randn(1, num_kv_heads, head_dim, generator=g).to(device, dtype)
    positions = torch.tensor([ctx - 1], device=device)
    slots = b.block_tables[0, (ctx - 1) // block_size].long().reshape(1) * block_size + (ctx - 1) % block_size
    table = cos_sin(ctx + 8, rotary_dim, device)
    norm_w = (None, None)
    if qk_norm:
        norm_w = tuple((1 + 0.2 * torch.randn(head_dim, generator=g)).to(device, dtype) for _ in range(2))
    o_weight = (torch.randn(hidden, group * num_kv_heads * head_dim, generator=g)
                / (group * num_kv_heads * head_dim) ** 0.5).to(device, dtype)
    return b, k_new, v_new, positions, slots, table, norm_w, o_weight


def reference_sums(b, k_new, v_new, positions, slots, table, norm_w, o_weight, scale):
    """The reference ops on copies of the caches: (o_proj's fp32 sums of the attention output
    rounded to the model dtype, the caches after the step)."""
    from hotpath.ops.rotary import reference as rotary_reference

    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
    q = rotary_reference.qk_norm_rope_and_cache(b.q, k_new, v_new, positions, table, k_cache,
                                                v_cache, slots, *norm_w, 1e-6)
    out = reference.paged_attention(q.float(), k_cache.float(), v_cache.float(), b.cu_query_lens,
                                    b.context_lens, b.block_tables, scale, 1, b.max_context_len)
    x = out.to(b.q.dtype).float().reshape(1, -1)
    return x @ o_weight.float().t(), k_cache, v_cache


def check(ctx, group, num_kv_heads, head_dim, rotary_dim, hidden, qk_norm, dtype, device,
          num_splits=None, block_size=4, max_context_len=None):
    from hotpath.ops.attention import triton_decode, triton_out_proj

    b, k_new, v_new, positions, slots, table, norm_w, o_weight = one_token_inputs(
        ctx, group, num_kv_heads, head_dim, rotary_dim, hidden, qk_norm, dtype, device, block_size)
    if max_context_len is not None:  # a graph sized for a longer context than this one
        b.max_context_len = max_context_len
    scale = head_dim**-0.5
    want, want_k, want_v = reference_sums(b, k_new, v_new, positions, slots, table, norm_w,
                                          o_weight, scale)
    sums = torch.empty(1, hidden, dtype=torch.float32, device=device)  # NaN when poisoned
    partials = triton_decode.paged_attention(
        b.q, b.k_cache, b.v_cache, b.cu_query_lens, b.context_lens, b.block_tables, scale, 1,
        b.max_context_len, num_splits=num_splits, rope=(k_new, v_new, table, *norm_w, 1e-6),
        defer=sums)
    assert isinstance(partials, triton_decode.SplitPartials)
    if num_splits is not None:
        assert partials.num_splits == num_splits
    got = triton_out_proj.merge_and_project(partials, o_weight, sums, num_kv_heads)
    assert got is sums and got.dtype == torch.float32
    assert rel_err(got, want) < TOL[dtype]
    for got_cache, want_cache in ((b.k_cache, want_k), (b.v_cache, want_v)):
        assert torch.equal(got_cache.isnan(), want_cache.isnan())  # the new token's slot written
        written = ~want_cache.isnan()
        assert rel_err(got_cache[written], want_cache[written]) < TOL[dtype] / 4


# ---- under the Triton interpreter (CPU, fp32, small shapes) ------------------------------------
@pytest.mark.parametrize("num_splits", [None, 1, 3, 7])
@pytest.mark.parametrize("ctx", [1, 9, 30])
@pytest.mark.parametrize("group,head_dim,rotary_dim,qk_norm", [(1, 16, 16, True), (2, 24, 16, False),
                                                               (3, 16, 8, True)])
def test_interpreter(ctx, num_splits, group, head_dim, rotary_dim, qk_norm, interpreter, poisoned):
    """Contexts inside one split and over several, empty splits, a group that is no power of 2
    and a head_dim that pads; the sums buffer starts NaN, so the attention must zero it."""
    check(ctx, group, 2, head_dim, rotary_dim, 40, qk_norm, torch.float32, "cpu", num_splits)


def test_interpreter_merge_rounds(interpreter, poisoned, monkeypatch):
    """Fewer splits a round than the context holds: the running max across rounds."""
    from hotpath.ops.attention import triton_out_proj

    monkeypatch.setattr(triton_out_proj, "MERGE_ELEMENTS", 2 * 32)  # 2 q heads x 16 dims: 2 splits
    check(100, 2, 2, 16, 16, 24, True, torch.float32, "cpu", num_splits=7)  # 7 splits of 16 keys


def test_interpreter_dispatch(interpreter, poisoned):
    """rope_attention_and_out_proj: the kernels, and the reference ops, give the same sums; a
    batch of more than one token is refused with the limit named."""
    b, k_new, v_new, positions, slots, table, norm_w, o_weight = one_token_inputs(
        21, 2, 2, 16, 16, 40, True, torch.float32, "cpu", 4)
    got = {}
    for name in ("triton", "reference"):
        backend.set_backend(name)
        k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()
        got[name] = attention.rope_attention_and_out_proj(
            b.q, k_new, v_new, positions, table, k_cache, v_cache, slots, *norm_w, 1e-6,
            b.cu_query_lens, b.context_lens, b.block_tables, 0.25, 1, 64, o_weight)
    assert got["triton"].shape == (1, 40) and got["triton"].dtype == torch.float32
    assert rel_err(got["triton"], got["reference"]) < 1e-5
    with pytest.raises(ValueError, match="one query token"):
        attention.rope_attention_and_out_proj(
            torch.cat([b.q, b.q]), k_new, v_new, positions, table, b.k_cache, b.v_cache, slots,
            *norm_w, 1e-6, b.cu_query_lens, b.context_lens, b.block_tables, 0.25, 1, 64, o_weight)


def test_pays_where_the_projection_streams_in_one_wave(monkeypatch):
    """The rule from run I (H200, 132 SMs): Qwen3-0.6B's o_proj (4 MB) merges the splits;
    Qwen3-8B's (33.5 MB) and -32B's (84 MB) leave them to attention."""
    from hotpath.ops.attention import triton_out_proj

    monkeypatch.setattr(triton_out_proj, "sm_count", lambda device: 132)
    cuda0 = torch.device("cuda", 0)
    assert triton_out_proj.pays(1024, 16, 8, 128, 2, cuda0)
    assert not triton_out_proj.pays(4096, 32, 8, 128, 2, cuda0)
    assert not triton_out_proj.pays(5120, 64, 8, 128, 2, cuda0)


# ---- on the GPU: real shapes -------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("ctx", [1, 17, 532, 4099, 32768])
@pytest.mark.parametrize("group,hidden", [(2, 1024), (4, 4096), (8, 5120), (5, 5120)])
def test_cuda(ctx, group, hidden, gpu_triton, poisoned):
    """Qwen3-0.6B, -8B, -32B and Qwen2.5-32B heads (8 kv heads of 128), bf16, in a graph sized
    for 32k as a server's is."""
    check(ctx, group, 8, 128, 128, hidden, True, torch.bfloat16, "cuda", block_size=16,
          max_context_len=32768)


@cuda
@pytest.mark.parametrize("num_splits", [1, 3, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_forced_splits(num_splits, dtype, gpu_triton, poisoned):
    check(5000, 4, 8, 128, 128, 4096, True, dtype, "cuda", num_splits=num_splits, block_size=16)
