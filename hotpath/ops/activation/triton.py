"""SiLU-and-mul kernel: silu(gate) * up in one pass over [gate | up]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, half, stride_x, stride_o, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + half + cols, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    # rounded to the input dtype between the two steps, as torch computes silu(gate) * up
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, 2 * intermediate] = [gate | up] -> silu(gate) * up: [num_tokens, intermediate]."""
    half = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], half), dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0:
        grid = (x2.shape[0], triton.cdiv(half, BLOCK))
        use_pdl = pdl_enabled(x.device)
        _silu_and_mul_kernel[grid](x2, out, half, x2.stride(0), out.stride(0), BLOCK=BLOCK,
                                   USE_PDL=use_pdl, num_warps=4, **pdl_launch(use_pdl))
    return out.view(x.shape[:-1] + (half,))
