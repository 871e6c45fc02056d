"""The fused QK-norm + RoPE + KV-cache write against its reference."""

import pytest
import torch

from hotpath.ops import rotary
from hotpath.ops.rotary import reference
from ops_cases import TOL, cos_sin, cuda, empty_cache, rel_err


def e4m3_steps(x: torch.Tensor) -> torch.Tensor:
    """fp8 values as signed step counts from zero (sign and magnitude bits: -0 and +0 both 0)."""
    bits = x.view(torch.uint8).int()
    return torch.where(bits >= 128, 128 - bits, bits)


def check_fused(num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim, qk_norm, dtype, device,
                layout="nhd", block_size=16, kv_dtype=None, scales=(1.0, 1.0)):
    """The kernel against the reference: q, and the cache slots written. With an fp8 `kv_dtype`
    the cache is fp8 at `scales` (k_scale, v_scale), and its bytes must equal the reference's
    (the keys' in fp32; in 16 bits up to QK-norm's rounding)."""
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
    caches = [empty_cache(num_blocks, block_size, num_kv_heads, head_dim, kv_dtype or dtype, device,
                          layout) for _ in range(4)]
    got = rotary.qk_norm_rope_and_cache(q, k, v, positions, table, caches[0], caches[1], slots,
                                        *weights, 1e-6, *scales)
    want = reference.qk_norm_rope_and_cache(q, k, v, positions, table, caches[2], caches[3],
                                            slots, *weights, 1e-6, *scales)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel_err(got, want) < TOL[dtype] / 4
    for got_cache, want_cache in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got_cache.isnan(), want_cache.isnan())  # the same slots written
        written = ~want_cache.isnan()
        if kv_dtype is None:
            assert rel_err(got_cache[written], want_cache[written]) < TOL[dtype] / 4
        elif got_cache is caches[1] or dtype == torch.float32:
            assert torch.equal(got_cache.view(torch.uint8), want_cache.view(torch.uint8))
        else:
            # a 16-bit key's QK-norm may round differently (rsqrt) before it is quantized: at most
            # one e4m3 step apart, rarely (-0 and +0 the same step)
            diff = (e4m3_steps(got_cache[written]) - e4m3_steps(want_cache[written])).abs()
            assert diff.max() <= 1 and diff.float().mean() < 0.01, (int(diff.max()),
                                                                    float(diff.float().mean()))


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim,layout", [(32, 32, "nhd"), (40, 24, "hnd")])
def test_interpreter_fused(qk_norm, head_dim, rotary_dim, layout, interpreter, poisoned):
    check_fused(7, 4, 2, head_dim, rotary_dim, qk_norm, torch.float32, "cpu", layout, block_size=4)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim,layout", [(32, 32, "nhd"), (40, 24, "hnd")])
def test_interpreter_fused_fp8_cache(qk_norm, head_dim, rotary_dim, layout, fp8, interpreter,
                                     poisoned):
    """Keys rotated, rounded to the model dtype, divided by k_scale and rounded to e4m3 (values
    by v_scale): the cache's bytes equal the reference's, the clamp at fp8's maximum included
    (randn / 0.01 passes 240 and 448)."""
    check_fused(7, 4, 2, head_dim, rotary_dim, qk_norm, torch.float32, "cpu", layout, block_size=4,
                kv_dtype=fp8, scales=(0.05, 0.01))


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


@cuda
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 128), (16, 16, 64), (40, 8, 128)])
def test_cuda_fused_fp8_cache(num_heads, num_kv_heads, head_dim, dtype, qk_norm, gpu_triton, poisoned):
    """The fp8 cache's bytes equal the reference's on the GPU too (IEEE division and
    round-to-nearest-even on both sides), up to QK-norm's 16-bit rounding for the keys. e4m3fn:
    the dtype of NVIDIA GPUs and gfx950."""
    for num_tokens in (1, 333):
        check_fused(num_tokens, num_heads, num_kv_heads, head_dim, head_dim, qk_norm, dtype, "cuda",
                    "hnd", kv_dtype=torch.float8_e4m3fn, scales=(0.05, 0.01))
