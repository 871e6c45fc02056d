"""Paged attention: the reference against plain causal attention, and the Triton kernels (prefill,
decode with context splits, the KV-cache write) against the reference."""

import pytest
import torch

from hotpath.ops import attention
from hotpath.ops.attention import reference
from ops_cases import TOL, cos_sin, cuda, empty_cache, paged_batch, rel_err


def dense_causal_attention(q, k, v, scale):
    """q: [query_len, heads, dim] the last positions of k, v: [ctx, kv_heads, dim]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1).double()
    v = v.repeat_interleave(group, dim=1).transpose(0, 1).double()
    q = q.transpose(0, 1).double()
    ctx, query_len = k.shape[1], q.shape[1]
    mask = torch.ones(query_len, ctx, dtype=torch.bool).tril(ctx - query_len)
    scores = (q @ k.transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)


def test_reference_matches_dense_attention():
    qlens, ctxs = [1, 5, 12, 3], [1, 9, 12, 40]
    b = paged_batch(qlens, ctxs, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                    dtype=torch.float32, device="cpu")
    out = reference.paged_attention(*b.args(0.4))
    for i, ctx in enumerate(ctxs):
        pos = torch.arange(ctx)
        blocks = b.block_tables[i, pos // 4].long()
        k, v = b.k_cache[blocks, pos % 4], b.v_cache[blocks, pos % 4]
        start, end = int(b.cu_query_lens[i]), int(b.cu_query_lens[i + 1])
        want = dense_causal_attention(b.q[start:end], k, v, 0.4)
        assert rel_err(out[start:end], want) < 1e-6


def check_kernel(batch, scale=0.3, **kernel_kwargs):
    """The op through the dispatch (or one kernel, with kwargs) against the fp32 reference."""
    want = reference.paged_attention(*batch.fp32_args(scale))
    if kernel_kwargs:
        kernel = kernel_kwargs.pop("kernel")
        got = kernel.paged_attention(*batch.args(scale), **kernel_kwargs)
    else:
        got = attention.paged_attention(*batch.args(scale))
    assert got.dtype == batch.q.dtype and got.shape == batch.q.shape
    err = rel_err(got, want)
    assert err < TOL[batch.q.dtype], f"relative error {err:.2e}"
    return err


# ---- under the Triton interpreter (CPU, fp32, small shapes) ------------------------------------
# (query_lens, context_lens): decodes at block boundaries, a verify step (k+1 queries per sequence)
# mixed with decodes, prefills after cached prefixes (chunked prefill, prefix hits), fresh prefills
INTERP_CASES = {
    "decode": ([1, 1, 1, 1, 1], [1, 4, 5, 16, 37]),
    "verify": ([4, 1, 3], [4, 9, 30]),
    "prefill_with_prefix": ([20, 7, 1, 33], [20, 30, 12, 50]),
}


@pytest.mark.parametrize("case", list(INTERP_CASES))
@pytest.mark.parametrize("group,head_dim,layout", [(1, 16, "nhd"), (4, 24, "hnd"), (2, 32, "nhd")])
def test_interpreter_dispatch(case, group, head_dim, layout, interpreter, poisoned):
    qlens, ctxs = INTERP_CASES[case]
    b = paged_batch(qlens, ctxs, num_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                    block_size=4, dtype=torch.float32, device="cpu", layout=layout)
    check_kernel(b)


@pytest.mark.parametrize("merge_elements", [8192, 16])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 20])
def test_interpreter_decode_splits(num_splits, merge_elements, interpreter, poisoned, monkeypatch):
    """Splits merged by the last to arrive: in one round, or (merge_elements 16) one split a
    round with a running max; the merge counters are left at zero."""
    from hotpath.ops.attention import triton_decode

    monkeypatch.setattr(triton_decode, "MERGE_ELEMENTS", merge_elements)
    # 5 splits of 16 keys over contexts up to 70: the short sequences have empty splits
    b = paged_batch([1, 2, 1], [3, 17, 70], num_heads=8, num_kv_heads=2, head_dim=16,
                    block_size=8, dtype=torch.float32, device="cpu")
    check_kernel(b, kernel=triton_decode, num_splits=num_splits, block_n=16)
    assert not triton_decode._counters(torch.device("cpu")).any()


@pytest.mark.parametrize("merge_kernel_splits", [32, 2])
@pytest.mark.parametrize("num_splits", [2, 5, 20])
@pytest.mark.parametrize("ctxs", [[1], [17], [70], [70, 1, 17]])
def test_interpreter_decode_merge_kernel(ctxs, num_splits, merge_kernel_splits, interpreter,
                                         poisoned, monkeypatch):
    """A call of one query token a sequence with splits stores the partials and merges them in a
    kernel of its own, a program per (token, head) (in one round, or two splits a round with a
    running max); the last-split merge's counters are not touched. Contexts inside one split,
    over several, with empty ones; one sequence and several of different lengths."""
    from hotpath.ops.attention import triton_decode

    monkeypatch.setattr(triton_decode, "MERGE_KERNEL_SPLITS", merge_kernel_splits)
    launched = []
    kernel = triton_decode._merge_head_kernel
    monkeypatch.setattr(triton_decode, "_merge_head_kernel",
                        type("K", (), {"__getitem__": lambda self, grid: launched.append(grid) or kernel[grid]})())
    b = paged_batch([1] * len(ctxs), ctxs, num_heads=6, num_kv_heads=2, head_dim=24, block_size=8,
                    dtype=torch.float32, device="cpu")
    check_kernel(b, kernel=triton_decode, num_splits=num_splits, block_n=16)
    assert launched == [(len(ctxs), 6)]
    assert not triton_decode._counters(torch.device("cpu")).any()


def test_merge_chunk():
    """Splits a merge round reads: MERGE_ELEMENTS partials, at least MIN_MERGE_SPLITS where that
    is at most twice as many, never more than the splits."""
    from hotpath.ops.attention.triton_decode import merge_chunk

    assert merge_chunk(66, 2 * 128) == 32  # Qwen3-0.6B: 2 q heads a kv head
    assert merge_chunk(66, 4 * 128) == 16  # Qwen3-8B
    assert merge_chunk(66, 8 * 128) == 16  # Qwen3-32B: one round for 16 splits, not two of 8
    assert merge_chunk(66, 16 * 128) == 4  # a 4-token verify step at 4 q heads
    assert merge_chunk(5, 8 * 128) == 8


def test_interpreter_decode_graph_sized(interpreter, poisoned):
    """A CUDA graph is captured with max_context_len = max_model_len: the splits sized for that
    must still cover (and spread) each sequence's shorter context."""
    b = paged_batch([1, 1, 2], [5, 33, 90], num_heads=4, num_kv_heads=2, head_dim=16,
                    block_size=4, dtype=torch.float32, device="cpu")
    b.max_context_len = 4096
    check_kernel(b)


def test_interpreter_prefill_small_tiles(interpreter, poisoned):
    from hotpath.ops.attention import triton_prefill

    # 16x16 tiles: several unmasked key tiles before the diagonal, ragged last tiles
    b = paged_batch([40, 3, 17], [70, 3, 29], num_heads=4, num_kv_heads=1, head_dim=16,
                    block_size=4, dtype=torch.float32, device="cpu")
    check_kernel(b, kernel=triton_prefill, config=(16, 16, 4, 2))


def new_token_slots(b, qlens, ctxs, block_size=4):
    """The positions of each sequence's query tokens (the last of its context) and their cache
    slots through its block table, as the engine builds them."""
    device = b.block_tables.device
    positions = torch.cat([torch.arange(c - q, c) for q, c in zip(qlens, ctxs)]).to(device)
    seq_of = torch.repeat_interleave(torch.arange(len(qlens)), torch.tensor(qlens)).to(device)
    return positions, b.block_tables[seq_of, positions // block_size].long() * block_size + positions % block_size


def check_rope_fused(qlens, ctxs, group, head_dim, rotary_dim, qk_norm, dtype, device,
                     num_splits=None, layout="nhd", num_kv_heads=2, block_size=4, max_context_len=None,
                     kv_dtype=None, positions_apart=False):
    """rope_and_paged_attention (one decode kernel) against qk_norm_rope_and_cache then attention,
    both in the reference: the output, and every cache slot (the new tokens' keys and values).
    With an fp8 `kv_dtype`, the cache is fp8 (scales K_SCALE, V_SCALE). `positions_apart`: the
    tokens rotate at positions of their own (an mRoPE model's: each sequence's cache positions
    shifted by its own offset, and one token at a row past the context), given to the kernel."""
    from hotpath.ops.attention import triton_decode
    from hotpath.ops.rotary import reference as rotary_reference

    b = paged_batch(qlens, ctxs, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, block_size=block_size, dtype=dtype, device=device,
                    layout=layout, seed=len(qlens))
    if max_context_len is not None:  # a graph sized for a longer context
        b.max_context_len = max_context_len
    scales = {}
    if kv_dtype is not None:
        fp8_batch(b, kv_dtype)
        scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    g = torch.Generator().manual_seed(7)
    num_tokens = b.q.shape[0]
    k_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(device, dtype)
    v_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(device, dtype)
    positions, slots = new_token_slots(b, qlens, ctxs, block_size)
    table = cos_sin(max(512, max(ctxs)), rotary_dim, device)
    rope_positions = None
    if positions_apart:
        shifts = torch.randint(-3, 0, (len(qlens),), generator=g).repeat_interleave(torch.tensor(qlens))
        positions = (positions.cpu() + shifts).clamp(min=0)
        positions[-1] = table.shape[0] - 1  # a visual token's row past the text positions
        positions = rope_positions = positions.to(device)
    weights = (None, None)
    if qk_norm:
        weights = tuple((1 + 0.2 * torch.randn(head_dim, generator=g)).to(device, dtype) for _ in range(2))
    want_k, want_v = b.k_cache.clone(), b.v_cache.clone()
    q = rotary_reference.qk_norm_rope_and_cache(b.q, k_new, v_new, positions, table, want_k, want_v,
                                                slots, *weights, 1e-6, **scales)
    if kv_dtype is None:
        want_k, want_v = want_k.float(), want_v.float()
    want = reference.paged_attention(q.float(), want_k, want_v, b.cu_query_lens,
                                     b.context_lens, b.block_tables, 0.3, b.max_query_len,
                                     b.max_context_len, **scales)
    rope = (k_new, v_new, table, *weights, 1e-6)
    got = triton_decode.paged_attention(b.q, b.k_cache, b.v_cache, b.cu_query_lens, b.context_lens,
                                        b.block_tables, 0.3, b.max_query_len, b.max_context_len,
                                        num_splits=num_splits, rope=rope, rope_positions=rope_positions,
                                        **scales)
    assert rel_err(got, want) < TOL[dtype]
    for got_cache, want_cache in ((b.k_cache, want_k), (b.v_cache, want_v)):
        assert torch.equal(got_cache.isnan(), want_cache.isnan())  # the same slots written
        written = ~want_cache.isnan()
        if kv_dtype is None:
            assert rel_err(got_cache[written], want_cache[written]) < TOL[dtype] / 4
        else:
            # the kernel's QK-norm and RoPE round like the reference's but need not be bit-equal
            # to it: at most one fp8 step apart, and rarely
            diff = (got_cache[written].view(torch.uint8).int()
                    - want_cache[written].view(torch.uint8).int()).abs()
            assert diff.max() <= 1 and diff.float().mean() < 0.02, (int(diff.max()),
                                                                    float(diff.float().mean()))


@pytest.mark.parametrize("num_splits", [None, 1, 3, 7])
@pytest.mark.parametrize("qk_norm,head_dim,rotary_dim", [(True, 16, 16), (False, 24, 16)])
def test_interpreter_rope_fused_decode(num_splits, qk_norm, head_dim, rotary_dim, interpreter,
                                       poisoned):
    """Decodes at block boundaries and a verify step whose new tokens straddle splits."""
    check_rope_fused([1, 4, 1, 3], [1, 9, 17, 30], 2, head_dim, rotary_dim, qk_norm,
                     torch.float32, "cpu", num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_interpreter_rope_fused_positions_apart(num_splits, interpreter, poisoned):
    """mRoPE models: the kernel rotates at the positions it is given, not at the cache positions
    (one split: the query rotated after the cache write; several: before)."""
    check_rope_fused([1, 4, 1, 3], [1, 9, 17, 30], 2, 16, 16, True, torch.float32, "cpu", num_splits,
                     positions_apart=True)


@pytest.mark.parametrize("num_splits", [None, 3, 7])
@pytest.mark.parametrize("ctx", [1, 4, 30])
def test_interpreter_rope_fused_one_token(ctx, num_splits, interpreter, poisoned):
    """Batch-1 decode: the fused kernel's splits merged by the merge kernel."""
    check_rope_fused([1], [ctx], 3, 16, 16, True, torch.float32, "cpu", num_splits)


def test_interpreter_rope_fused_dispatch(interpreter, poisoned):
    """rope_and_paged_attention: the fused kernel for decode-sized steps, the two ops beyond."""
    from hotpath.ops.rotary import reference as rotary_reference

    for qlens, ctxs in (([1, 2], [5, 9]), ([12, 3], [20, 3])):
        b = paged_batch(qlens, ctxs, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                        dtype=torch.float32, device="cpu")
        k_new, v_new = torch.randn(sum(qlens), 2, 16), torch.randn(sum(qlens), 2, 16)
        positions, slots = new_token_slots(b, qlens, ctxs)
        table = torch.randn(64, 16)
        want_k, want_v = b.k_cache.clone(), b.v_cache.clone()
        q = rotary_reference.qk_norm_rope_and_cache(b.q, k_new, v_new, positions, table, want_k,
                                                    want_v, slots)
        want = reference.paged_attention(q, want_k, want_v, *b.args(0.3)[3:])
        got = attention.rope_and_paged_attention(b.q, k_new, v_new, positions, table, b.k_cache,
                                                 b.v_cache, slots, None, None, 1e-6,
                                                 *b.args(0.3)[3:])
        assert rel_err(got, want) < 1e-5


def test_interpreter_write_kv_cache(interpreter):
    """Also: the kernel skips a negative slot (the reference needs slots >= 0), rather than
    writing out of bounds."""
    k = torch.randn(5, 2, 24)
    v = torch.randn(5, 2, 24)
    slots = torch.tensor([7, 0, -1, 12, 3])
    keep = slots >= 0
    for layout in ("nhd", "hnd"):
        caches = [empty_cache(4, 4, 2, 24, torch.float32, "cpu", layout) for _ in range(4)]
        attention.write_kv_cache(k, v, caches[0], caches[1], slots)
        reference.write_kv_cache(k[keep], v[keep], caches[2], caches[3], slots[keep])
        for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())


# ---- fp8 KV cache (e4m3: k_cache holds k / k_scale) ---------------------------------------------
FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]  # NVIDIA / AMD gfx950, AMD gfx942
K_SCALE, V_SCALE = 0.05, 0.02  # randn / 0.05 reaches past e4m3fnuz's 240: the clamp is exercised


def fp8_cache(cache: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """`cache` quantized as the reference writes it, in the same memory order (NaN slots stay
    NaN: fp8 caches are poisoned too)."""
    out = torch.empty_strided(cache.shape, cache.stride(), dtype=dtype, device=cache.device)
    out.copy_(reference.quantize_kv(cache, dtype, scale))
    return out


def fp8_batch(b, dtype: torch.dtype):
    b.k_cache = fp8_cache(b.k_cache, dtype, K_SCALE)
    b.v_cache = fp8_cache(b.v_cache, dtype, V_SCALE)
    return b


def check_fp8_kernel(batch, scale=0.3, tol=None, **kernel_kwargs):
    """The op with an fp8 cache against the reference reading the same cache (the same
    dequantized keys and values: only the arithmetic's rounding differs)."""
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE)
    want = reference.paged_attention(*batch.fp32_args(scale)[:1], *batch.args(scale)[1:], **scales)
    if kernel_kwargs:
        kernel = kernel_kwargs.pop("kernel")
        got = kernel.paged_attention(*batch.args(scale), **kernel_kwargs, **scales)
    else:
        got = attention.paged_attention(*batch.args(scale), **scales)
    assert got.dtype == batch.q.dtype and got.shape == batch.q.shape
    err = rel_err(got, want)
    assert err < (tol or TOL[batch.q.dtype]), f"relative error {err:.2e}"


def test_fp8_reference_is_attention_over_the_dequantized_cache():
    """The reference with an fp8 cache equals attention over k_fp8 * k_scale, v_fp8 * v_scale in
    fp32, and stays within fp8's rounding of attention over the unquantized cache."""
    b = paged_batch([1, 5, 12], [9, 12, 40], num_heads=4, num_kv_heads=2, head_dim=16,
                    block_size=4, dtype=torch.float32, device="cpu")
    exact = reference.paged_attention(*b.args(0.3))
    k_fp8, v_fp8 = fp8_cache(b.k_cache, FP8[0], K_SCALE), fp8_cache(b.v_cache, FP8[0], V_SCALE)
    got = reference.paged_attention(b.q, k_fp8, v_fp8, *b.args(0.3)[3:], k_scale=K_SCALE,
                                    v_scale=V_SCALE)
    dequantized = reference.paged_attention(b.q, k_fp8.float() * K_SCALE, v_fp8.float() * V_SCALE,
                                            *b.args(0.3)[3:])
    assert torch.equal(got, dequantized)
    assert 1e-4 < rel_err(got, exact) < 0.05  # e4m3: 3 mantissa bits


def test_fp8_scales_are_checked():
    b = paged_batch([1], [5], num_heads=2, num_kv_heads=2, head_dim=8, block_size=4,
                    dtype=torch.float32, device="cpu")
    fp8_batch(b, FP8[0])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scales must be positive"):
            reference.paged_attention(*b.args(0.3), k_scale=bad)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("case", list(INTERP_CASES))
def test_interpreter_fp8_dispatch(case, fp8, interpreter, poisoned):
    """Decode (split and direct), verify and prefill kernels reading an fp8 cache."""
    qlens, ctxs = INTERP_CASES[case]
    b = paged_batch(qlens, ctxs, num_heads=4, num_kv_heads=2, head_dim=24, block_size=4,
                    dtype=torch.float32, device="cpu", layout="hnd")
    check_fp8_kernel(fp8_batch(b, fp8))


@pytest.mark.parametrize("num_splits", [1, 5])
def test_interpreter_fp8_decode_splits(num_splits, interpreter, poisoned):
    """Split partials scaled by v_scale before they are merged: by the last split (a verify
    step) and by the merge kernel (one token a sequence)."""
    from hotpath.ops.attention import triton_decode

    for qlens, ctxs in (([1, 2, 1], [3, 17, 70]), ([1, 1], [70, 17])):
        b = paged_batch(qlens, ctxs, num_heads=8, num_kv_heads=2, head_dim=16, block_size=8,
                        dtype=torch.float32, device="cpu")
        check_fp8_kernel(fp8_batch(b, FP8[0]), kernel=triton_decode, num_splits=num_splits,
                         block_n=16)


def test_interpreter_fp8_prefill_small_tiles(interpreter, poisoned):
    from hotpath.ops.attention import triton_prefill

    b = paged_batch([40, 3, 17], [70, 3, 29], num_heads=4, num_kv_heads=1, head_dim=16,
                    block_size=4, dtype=torch.float32, device="cpu")
    check_fp8_kernel(fp8_batch(b, FP8[0]), kernel=triton_prefill, config=(16, 16, 4, 2))


def fp8_inputs(num_tokens: int, num_kv_heads: int, head_dim: int, scale: float, device="cpu",
               dtype=torch.float32) -> torch.Tensor:
    """Values that put e4m3's rounding to work at `scale`: random ones over its whole range and
    past its maximum (clamped), subnormals, exact ties between two e4m3 values (to even), a tiny
    negative and -0.0 (both -0; e4m3fnuz has no -0: 0)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g) * torch.tensor(
        [1e-3, 0.05, 1.0, 30.0])[torch.randint(0, 4, (num_tokens, num_kv_heads, 1), generator=g)]
    ties = torch.tensor([1.0625, 1.1875, 17.0, 18.0, 0.0068359375, 232.0, 464.0, -1.0625,
                         2.0 ** -10, 3 * 2.0 ** -11, -1e-5, 1e6, -1e6, 0.0, -0.0])
    flat = x.view(-1)
    flat[: ties.numel()] = ties * scale
    return x.to(device, dtype)


@pytest.mark.parametrize("fp8", FP8)
def test_interpreter_fp8_write_kv_cache_is_bit_exact(fp8, interpreter):
    """The KV-write kernel's fp8 bytes equal the reference's, in both memory orders; negative
    slots are skipped."""
    k = fp8_inputs(6, 2, 24, K_SCALE)
    v = fp8_inputs(6, 2, 24, V_SCALE).flip(0)
    slots = torch.tensor([7, 0, -1, 12, 3, 9])
    keep = slots >= 0
    for layout in ("nhd", "hnd"):
        caches = [empty_cache(4, 4, 2, 24, fp8, "cpu", layout) for _ in range(4)]
        attention.write_kv_cache(k, v, caches[0], caches[1], slots, K_SCALE, V_SCALE)
        reference.write_kv_cache(k[keep], v[keep], caches[2], caches[3], slots[keep], K_SCALE,
                                 V_SCALE)
        for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("qk_norm,head_dim,rotary_dim", [(True, 16, 16), (False, 24, 16)])
def test_interpreter_fp8_rope_fused_decode(num_splits, qk_norm, head_dim, rotary_dim, interpreter,
                                           poisoned):
    """The decode kernel quantizing this step's keys and values into an fp8 cache as it rotates
    them, then reading them back with the rest."""
    check_rope_fused([1, 4, 1, 3], [1, 9, 17, 30], 2, head_dim, rotary_dim, qk_norm,
                     torch.float32, "cpu", num_splits, kv_dtype=FP8[0])


# ---- on the GPU: the wide matrix -------------------------------------------------------------
def _ragged(kind: str) -> tuple[list[int], list[int]]:
    if kind == "decode":  # around block boundaries (16), and long
        return [1] * 8, [1, 15, 16, 17, 255, 256, 1000, 4099]
    if kind == "verify":  # k+1 = 4 query tokens, with a decode mixed in
        return [4, 4, 1, 4], [4, 33, 700, 2048]
    if kind == "prefill":  # fresh prompts, chunks after cached prefixes, a decode riding along
        return [1000, 17, 256, 1, 64], [1000, 17, 1300, 513, 64]
    raise ValueError(kind)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kind", ["decode", "verify", "prefill"])
def test_cuda_ragged(kind, group, head_dim, dtype, gpu_triton, poisoned):
    qlens, ctxs = _ragged(kind)
    b = paged_batch(qlens, ctxs, num_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                    block_size=16, dtype=dtype, device="cuda")
    check_kernel(b)


@cuda
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("ctx", [1, 2047, 8192, 32768])
@pytest.mark.parametrize("query_len", [1, 4])
def test_cuda_long_context_decode(ctx, query_len, layout, gpu_triton, poisoned):
    query_len = min(query_len, ctx)
    b = paged_batch([query_len], [ctx], num_heads=32, num_kv_heads=8, head_dim=128,
                    block_size=16, dtype=torch.bfloat16, device="cuda", layout=layout)
    check_kernel(b, scale=128**-0.5)


@cuda
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("qlens,ctxs", [([4096], [4096]), ([300, 512], [32768, 9000])])
def test_cuda_long_prefill(qlens, ctxs, layout, gpu_triton, poisoned):
    b = paged_batch(qlens, ctxs, num_heads=16, num_kv_heads=4, head_dim=128, block_size=16,
                    dtype=torch.bfloat16, device="cuda", layout=layout)
    check_kernel(b, scale=128**-0.5)


@cuda
@pytest.mark.parametrize("num_splits", [1, 3, 64])
def test_cuda_decode_forced_splits(num_splits, gpu_triton, poisoned):
    from hotpath.ops.attention import triton_decode

    b = paged_batch([1, 3, 1], [100, 5000, 17], num_heads=32, num_kv_heads=8, head_dim=128,
                    block_size=16, dtype=torch.bfloat16, device="cuda")
    check_kernel(b, kernel=triton_decode, num_splits=num_splits)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("qk_norm,head_dim,rotary_dim", [(True, 128, 128), (False, 64, 64), (True, 80, 40)])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_cuda_rope_fused_decode(num_splits, qk_norm, head_dim, rotary_dim, dtype, gpu_triton, poisoned):
    check_rope_fused([1, 4, 1, 3, 1], [1, 9, 17, 300, 64], 4, head_dim, rotary_dim, qk_norm,
                     dtype, "cuda", num_splits, layout="hnd")


@cuda
@pytest.mark.parametrize("ctxs", [[1], [17], [532], [4099], [32768], [532, 1, 4099, 17],
                                  [700] * 3 + [32768]])
@pytest.mark.parametrize("group,head_dim", [(2, 128), (4, 128), (8, 128), (5, 128), (4, 64)])
def test_cuda_decode_merge_kernel(ctxs, group, head_dim, gpu_triton, poisoned):
    """Decode of one or several sequences (their splits merged by the merge kernel) at
    Qwen3-0.6B, -8B, -32B and Qwen2.5-32B heads, with QK-norm, RoPE and the cache write fused,
    in a graph sized for 40k (66 splits at batch 1: 64 hold a 32k context, merged in two
    rounds)."""
    check_rope_fused([1] * len(ctxs), ctxs, group, head_dim, head_dim, True, torch.bfloat16,
                     "cuda", num_kv_heads=8, block_size=16, max_context_len=40960)


@cuda
def test_cuda_decode_in_cuda_graph(gpu_triton):
    """The decode path launches without host synchronisation, so it can be captured and replayed."""
    b = paged_batch([1, 1], [300, 5000], num_heads=32, num_kv_heads=8, head_dim=128,
                    block_size=16, dtype=torch.bfloat16, device="cuda")
    b.max_context_len = 32768  # as the runner captures: sized for max_model_len
    check_kernel(b, scale=0.1)
    args = b.args(0.1)
    eager = attention.paged_attention(*args)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        attention.paged_attention(*args)  # warm-up on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention.paged_attention(*args)
    b.q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(captured, attention.paged_attention(*args)) == 0.0
    assert not torch.equal(captured, eager)


# ---- fp8 KV cache on the GPU --------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("kind", ["decode", "verify", "prefill"])
def test_cuda_fp8_ragged(kind, group, head_dim, gpu_triton, poisoned):
    """bf16 queries over an e4m3fn cache: the decode and prefill kernels against the reference
    reading the same cache."""
    qlens, ctxs = _ragged(kind)
    b = paged_batch(qlens, ctxs, num_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                    block_size=16, dtype=torch.bfloat16, device="cuda", layout="hnd")
    check_fp8_kernel(fp8_batch(b, torch.float8_e4m3fn))


@cuda
@pytest.mark.parametrize("ctxs", [[1], [532], [32768], [532, 1, 4099, 17]])
def test_cuda_fp8_rope_fused_decode(ctxs, gpu_triton, poisoned):
    """Qwen3-8B heads, QK-norm, RoPE and the fp8 cache write fused into decode attention, in a
    graph-sized call (40k)."""
    check_rope_fused([1] * len(ctxs), ctxs, 4, 128, 128, True, torch.bfloat16, "cuda",
                     num_kv_heads=8, block_size=16, max_context_len=40960,
                     kv_dtype=torch.float8_e4m3fn)


@cuda
def test_cuda_fp8_write_kv_cache_is_bit_exact(gpu_triton):
    k = fp8_inputs(333, 8, 128, K_SCALE, "cuda", torch.bfloat16)
    v = fp8_inputs(333, 8, 128, V_SCALE, "cuda", torch.bfloat16).flip(0)
    slots = torch.randperm(40 * 16, generator=torch.Generator().manual_seed(0))[:333].cuda()
    caches = [empty_cache(40, 16, 8, 128, torch.float8_e4m3fn, "cuda", "hnd") for _ in range(4)]
    attention.write_kv_cache(k, v, caches[0], caches[1], slots, K_SCALE, V_SCALE)
    reference.write_kv_cache(k, v, caches[2], caches[3], slots, K_SCALE, V_SCALE)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
