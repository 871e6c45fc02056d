"""The sparse block's end in the fused decode chain: one program per row adds the routed experts'
sum (and the shared expert's output times the sigmoid of its gate) into the residual stream and
returns the new row's sum of squares, rounding as reference.add_into_residual does."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import (
    pdl_enabled,
    pdl_launch,
    pdl_launch_dependents,
    pdl_wait,
    row_warps,
)


@triton.jit
def _add_into_residual_kernel(
    residual_ptr,  # [M, H], updated in place
    experts_ptr,  # [M, H]
    shared_ptr,  # [M, H] (unused without HAS_SHARED)
    gate_ptr,  # [M] with row stride stride_g
    sumsq_ptr,  # [M] fp32
    H,
    stride_r,
    stride_e,
    stride_s,
    stride_g,
    HAS_SHARED: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)  # the next layer's projection loads its weights meanwhile
    pdl_wait(USE_PDL)
    m = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    dtype = residual_ptr.dtype.element_ty
    # each op in the model dtype, rounding as torch's ops do (launched without FP fusion, which
    # would skip the product's rounding before the add)
    out = tl.load(experts_ptr + m * stride_e + cols, mask=mask, other=0.0)
    if HAS_SHARED:
        g = tl.load(gate_ptr + m * stride_g).to(tl.float32)
        gate = (1.0 / (1.0 + tl.exp(-g))).to(dtype)
        s = tl.load(shared_ptr + m * stride_s + cols, mask=mask, other=0.0)
        out = out + gate * s
    r = tl.load(residual_ptr + m * stride_r + cols, mask=mask, other=0.0)
    h = r + out
    tl.store(residual_ptr + m * stride_r + cols, h, mask=mask)
    hf = h.to(tl.float32)
    tl.store(sumsq_ptr + m, tl.sum(hf * hf, 0))


def add_into_residual(
    residual: torch.Tensor,  # [M, H]
    experts_out: torch.Tensor,  # [M, H]
    shared_out: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,  # [M, 1]
) -> torch.Tensor:  # [1, M] fp32
    M, H = residual.shape
    assert residual.stride(-1) == experts_out.stride(-1) == 1
    has_shared = shared_out is not None
    if has_shared:
        assert shared_out.stride(-1) == 1 and shared_gate is not None
    sumsq = torch.empty((1, M), dtype=torch.float32, device=residual.device)
    if M:
        block = triton.next_power_of_2(H)
        use_pdl = pdl_enabled(residual.device)
        shared = shared_out if has_shared else experts_out
        gate = shared_gate if has_shared else experts_out
        _add_into_residual_kernel[(M,)](
            residual, experts_out, shared, gate, sumsq, H, residual.stride(0), experts_out.stride(0),
            shared.stride(0), gate.stride(0), HAS_SHARED=has_shared, BLOCK=block, USE_PDL=use_pdl,
            num_warps=row_warps(block), enable_fp_fusion=False, **pdl_launch(use_pdl),
        )
    return sumsq
