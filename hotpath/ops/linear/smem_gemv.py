"""One-row GEMV whose weight tile waits in shared memory (Gluon, NVIDIA sm_80+).

The Triton GEMV (triton_gemv.py) loads a program's weight tile into registers before PDL's wait,
so the weight streams while the previous kernel finishes; but registers bound how many programs,
so how many weight bytes, an SM holds at once: about 8 MB of Qwen3-8B's 33.5 MB o_proj is
loaded while decode attention runs (one 122-register program an SM beside attention's), the rest
streams after it. Here cp.async copies the tile into shared memory, which holds no registers, so
more programs (so more of the weight) fit beside attention's, and after the wait only x and the
sums are left. Used for residual projections (o_proj) at one row; the torch reference is
hotpath.ops.linear.reference.add_residual(reference.linear(x, w), residual).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from hotpath.ops.triton_utils import pdl_enabled

# cp.async global -> shared: named async_load from Triton 3.7 on
_copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _smem_gemv_residual_kernel(
    x_ptr,  # [K]
    w_ptr,  # [N, K], K contiguous
    out_ptr,  # [N] the residual stream, updated in place
    stat_ptr,  # [cdiv(N, BLOCK_N)] fp32 sums of squares of the new stream's tiles
    N,
    stride_wn,
    K: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CHUNK_K: gl.constexpr,  # K elements a thread group copies / sums at a time
    USE_PDL: gl.constexpr,
):
    if USE_PDL:
        _gdc_launch_dependents()
    num_warps: gl.constexpr = gl.num_warps()
    # [BLOCK_N, CHUNK_K]: 8 contiguous bf16 (16 bytes, one cp.async) a thread, warps along K
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, num_warps], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    cols_l: gl.constexpr = gl.SliceLayout(0, layout)
    NUM_CHUNKS: gl.constexpr = K // CHUNK_K
    smem_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    w_smem = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [NUM_CHUNKS, BLOCK_N, CHUNK_K], smem_l)

    pid = gl.program_id(0)
    rn = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
    # rows past N read row N - 1 (never stored), so the copies need no mask
    w_rows = w_ptr + gl.minimum(rn, N - 1).to(gl.int64)[:, None] * stride_wn
    rk = gl.arange(0, CHUNK_K, layout=cols_l)
    for c in gl.static_range(NUM_CHUNKS):
        _copy_to_shared(w_smem.index(c), w_rows + (c * CHUNK_K + rk)[None, :])
    async_copy.commit_group()
    if USE_PDL:
        _gdc_wait()
    # x as [NUM_CHUNKS, CHUNK_K], each thread holding its columns of every chunk, all loaded at
    # once (one round to L2) before the copies are waited for
    x_l: gl.constexpr = gl.BlockedLayout([NUM_CHUNKS, 8], [1, 32], [1, num_warps], [1, 0])
    rc = gl.arange(0, NUM_CHUNKS, layout=gl.SliceLayout(1, x_l))
    x = gl.load(x_ptr + rc[:, None] * CHUNK_K + gl.arange(0, CHUNK_K, layout=gl.SliceLayout(0, x_l))[None, :])
    x = x.to(gl.float32)
    # each thread reads back the elements it copied: no barrier needed after its own wait
    async_copy.wait_group(0)
    acc = gl.zeros([BLOCK_N], gl.float32, layout=rows_l)
    for c in gl.static_range(NUM_CHUNKS):
        x_c = gl.convert_layout(gl.sum(gl.where(rc[:, None] == c, x, 0.0), axis=0), cols_l)
        w = w_smem.index(c).load(layout).to(gl.float32)
        acc += gl.sum(w * x_c[None, :], axis=1)

    # the residual epilogue of triton_gemv._store_out, one row
    dtype: gl.constexpr = out_ptr.dtype.element_ty
    mask = rn < N
    h = (acc.to(dtype).to(gl.float32) + gl.load(out_ptr + rn, mask=mask, other=0.0).to(gl.float32)).to(dtype)
    gl.store(out_ptr + rn, h, mask=mask)
    hf = gl.where(mask, h.to(gl.float32), 0.0)
    gl.store(stat_ptr + pid, gl.sum(hf * hf, axis=0))


def linear_add_residual(
    x: torch.Tensor,  # [1, K]
    weight: torch.Tensor,  # [N, K], K contiguous
    residual: torch.Tensor,  # [1, N], updated in place
    block_n: int = 8,
    chunk_k: int = 1024,
    num_warps: int = 4,
) -> torch.Tensor:  # [cdiv(N, block_n), 1] fp32
    """residual += x @ weight^T for one row; returns the new row's partial sums of squares."""
    N, K = weight.shape
    assert x.shape == (1, K) and residual.shape == (1, N) and K % chunk_k == 0
    assert weight.stride(1) == 1 and x.is_contiguous() and residual.is_contiguous()
    n_tiles = triton.cdiv(N, block_n)
    stat = torch.empty((n_tiles, 1), dtype=torch.float32, device=x.device)
    use_pdl = pdl_enabled(x.device)
    _smem_gemv_residual_kernel[(n_tiles,)](
        x, weight, residual, stat, N, weight.stride(0), K=K, BLOCK_N=block_n, CHUNK_K=chunk_k,
        USE_PDL=use_pdl, num_warps=num_warps, launch_pdl=use_pdl)
    return stat
