"""The fused QK-norm + RoPE + KV-cache write against its reference."""

import pytest
import torch

from hotpath.ops import rotary
from hotpath.ops.rotary import reference
from ops_cases import TOL, cos_sin, cuda, empty_cache, rel_err


def check_fused(num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim, qk_norm, dtype, device,
                layout="nhd", block_size=16):
    g = torch.Generator().manual_seed(1)
    # q, k, v as the model has them: strided views into one qkv projection output
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=g).to(device, dtype)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(num_tokens, num_heads, head_dim)
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, 4096, (num_tokens,), generator=g).to(device)
    table = cos_sin(4096, rotary_dim, device)
    num_blocks = num_tokens // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens].to(device)
    weights = (None, None)
    if qk_norm:
        weights = tuple((1 + 0.1 * torch.randn(head_dim, generator=g)).to(device, dtype)
                        for _ in range(2))
    caches = [empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, layout)
              for _ in range(4)]
    got = rotary.qk_norm_rope_and_cache(q, k, v, positions, table, caches[0], caches[1], slots,
                                        *weights, 1e-6)
    want = reference.qk_norm_rope_and_cache(q, k, v, positions, table, caches[2], caches[3],
                                            slots, *weights, 1e-6)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_err(got, want) < TOL[dtype] / 4
    for got_cache, want_cache in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got_cache.isnan(), want_cache.isnan())  # the same slots written
        written = ~want_cache.isnan()
        assert rel_err(got_cache[written], want_cache[written]) < TOL[dtype] / 4


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim,layout", [(32, 32, "nhd"), (40, 24, "hnd")])
def test_interpreter_fused(qk_norm, head_dim, rotary_dim, layout, interpreter, poisoned):
    check_fused(7, 4, 2, head_dim, rotary_dim, qk_norm, torch.float32, "cpu", layout, block_size=4)


@cuda
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 128), (16, 16, 64),
                                                              (64, 4, 256), (40, 8, 128)])
def test_cuda_fused(num_heads, num_kv_heads, head_dim, dtype, qk_norm, layout, gpu_triton,
                    poisoned):
    for num_tokens in (1, 333):
        check_fused(num_tokens, num_heads, num_kv_heads, head_dim, head_dim, qk_norm, dtype,
                    "cuda", layout)
