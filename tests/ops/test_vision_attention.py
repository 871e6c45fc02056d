"""Varlen attention without a mask (vision towers): the reference against plain attention per
segment, and the Triton kernel against the reference."""

import pytest
import torch

from hotpath.ops import vision_attention
from hotpath.ops.vision_attention import reference
from ops_cases import TOL, cuda, rel_err


def segments(lengths: list[int], device) -> tuple[torch.Tensor, int]:
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return cu.to(device), max(lengths)


def qkv(total: int, num_heads: int, head_dim: int, dtype, device, seed: int = 0) -> tuple:
    """q, k, v as the tower passes them: strided views of one [total, 3, heads, dim] projection."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(total, 3, num_heads, head_dim, generator=g).to(dtype=dtype, device=device)
    return x[:, 0], x[:, 1], x[:, 2]


def test_reference_matches_sdpa_per_segment():
    lengths = [1, 7, 64, 100]
    q, k, v = qkv(sum(lengths), 3, 24, torch.float32, "cpu")
    cu, max_len = segments(lengths, "cpu")
    out = reference.varlen_attention(q, k, v, cu, max_len, 0.3)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (x[start:end].transpose(0, 1).double() for x in (q, k, v))
        want = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, scale=0.3)
        assert rel_err(out[start:end], want.transpose(0, 1)) < 1e-6


# segments of odd lengths around the tiles (32 in fp32): one token, under a tile, tile multiples,
# a tile and a bit
INTERP_LENGTHS = [1, 7, 64, 100, 33]


@pytest.mark.parametrize("head_dim", [64, 72, 16, 8, 36])
def test_interpreter_kernel(head_dim, interpreter, poisoned):
    q, k, v = qkv(sum(INTERP_LENGTHS), 2, head_dim, torch.float32, "cpu")
    cu, max_len = segments(INTERP_LENGTHS, "cpu")
    scale = head_dim**-0.5
    want = reference.varlen_attention(q, k, v, cu, max_len, scale)
    got = vision_attention.varlen_attention(q, k, v, cu, max_len, scale)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert rel_err(got, want) < TOL[torch.float32]


def test_interpreter_small_tiles(interpreter, poisoned):
    """Tiles smaller than the segments (several full key tiles, then the bounded last one) and
    contiguous inputs."""
    from hotpath.ops.vision_attention import triton as kernels

    lengths = [5, 40, 16, 1]
    q, k, v = (x.contiguous() for x in qkv(sum(lengths), 3, 72, torch.float32, "cpu", seed=1))
    cu, max_len = segments(lengths, "cpu")
    want = reference.varlen_attention(q, k, v, cu, max_len, 0.2)
    got = kernels.varlen_attention(q, k, v, cu, max_len, 0.2, config=(16, 16, 4, 1))
    assert rel_err(got, want) < TOL[torch.float32]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 72, 80])
def test_cuda_kernel(head_dim, dtype, gpu_triton, poisoned):
    lengths = [1, 7, 64, 100, 1024, 4096 + 17]
    q, k, v = qkv(sum(lengths), 16, head_dim, dtype, "cuda")
    cu, max_len = segments(lengths, "cuda")
    scale = head_dim**-0.5
    want = reference.varlen_attention(q.float(), k.float(), v.float(), cu, max_len, scale)
    got = vision_attention.varlen_attention(q, k, v, cu, max_len, scale)
    assert got.dtype == dtype
    assert rel_err(got, want) < TOL[dtype]


@cuda
@pytest.mark.parametrize("head_dim", [72, 64])
def test_cuda_cudnn_path(head_dim, poisoned):
    """Given the segments' lengths on the host, the default backend runs torch's cuDNN attention on
    runs of equal-length segments (an image, a video's frames) and is the reference's answer."""
    from hotpath.ops.vision_attention import sdpa

    lengths = [1, 7, 576, 576, 576, 100, 4096 + 17, 1024, 1024]
    q, k, v = qkv(sum(lengths), 16, head_dim, torch.bfloat16, "cuda")
    cu, max_len = segments(lengths, "cuda")
    scale = head_dim**-0.5
    assert sdpa.supported(q)
    want = reference.varlen_attention(q.float(), k.float(), v.float(), cu, max_len, scale)
    got = vision_attention.varlen_attention(q, k, v, cu, max_len, scale, lengths)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    assert rel_err(got, want) < TOL[torch.bfloat16]


@cuda
def test_cuda_vision_tower_bf16(poisoned):
    """A tower with Qwen3-VL's head_dim (72) in bf16 on the GPU at the defaults (cuDNN attention,
    fc1 with cuBLASLt's GELU epilogue, the position tables made on the device) against the same
    weights in fp32 through the references."""
    from hotpath.models.vision import VisionConfig, VisionTower
    from hotpath.ops import backend

    torch.manual_seed(0)
    cfg = VisionConfig(depth=3, hidden_size=144, intermediate_size=304, num_heads=2, out_hidden_size=64,
                       num_position_embeddings=64, deepstack_visual_indexes=(1,))
    tower = VisionTower(cfg).cuda()
    for p in tower.parameters():
        p.data.normal_(0, 0.05)
    grids = [(1, 16, 24), (2, 8, 8), (1, 30, 12)]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), cfg.patch_dim, device="cuda")
    with torch.no_grad():
        got, got_deepstack = tower.to(torch.bfloat16)(pixels, grids)
        previous = backend.get_backend()
        backend.set_backend("reference")
        try:
            want, want_deepstack = tower.float()(pixels, grids)
        finally:
            backend.set_backend(previous)
    assert rel_err(got, want) < 2 * TOL[torch.bfloat16]
    assert rel_err(got_deepstack[0], want_deepstack[0]) < 2 * TOL[torch.bfloat16]


def test_interpreter_vision_tower(interpreter, poisoned):
    """A tiny vision tower (head_dim 24) through the kernel equals it through the reference: the
    kernel on the tower's strided q / k / v and its per-frame segments."""
    from hotpath.models.vision import VisionConfig, VisionTower
    from hotpath.ops import backend

    torch.manual_seed(0)
    cfg = VisionConfig(depth=2, hidden_size=48, intermediate_size=64, num_heads=2, patch_size=2,
                       out_hidden_size=32, num_position_embeddings=16, deepstack_visual_indexes=(0,))
    tower = VisionTower(cfg)
    grids = [(1, 4, 6), (2, 2, 4)]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), cfg.patch_dim)
    with torch.no_grad():
        merged, deepstack = tower(pixels, grids)
        backend.set_backend("reference")
        want, want_deepstack = tower(pixels, grids)
    assert rel_err(merged, want) < TOL[torch.float32]
    assert rel_err(deepstack[0], want_deepstack[0]) < TOL[torch.float32]


@pytest.mark.parametrize("head_dim", [72, 16, 36])
def test_interpreter_rotary(head_dim, interpreter, poisoned):
    """The rotary kernel on q and k of every head at once, a strided view of the projection as
    the tower passes it, against the reference."""
    num_tokens, num_heads = 11, 3
    x = torch.randn(num_tokens, 3, num_heads, head_dim, generator=torch.Generator().manual_seed(2))
    qk = x[:, :2].flatten(1, 2)  # [num_tokens, 2 * num_heads, head_dim], token stride 3 * heads * dim
    angles = torch.rand(num_tokens, head_dim // 2) * 20
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    want = reference.apply_rotary(qk, cos, sin)
    got = vision_attention.apply_rotary(qk, cos, sin)
    assert got.shape == qk.shape and got.is_contiguous()
    assert rel_err(got, want) < 1e-6


@cuda
@pytest.mark.parametrize("head_dim", [64, 72])
def test_cuda_rotary(head_dim, gpu_triton, poisoned):
    x = torch.randn(4096, 3, 16, head_dim, device="cuda", dtype=torch.bfloat16)
    qk = x[:, :2].flatten(1, 2)
    angles = torch.rand(4096, head_dim // 2, device="cuda") * 60
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    want = reference.apply_rotary(qk, cos, sin)
    got = vision_attention.apply_rotary(qk, cos, sin)
    assert rel_err(got, want) < TOL[torch.bfloat16]
