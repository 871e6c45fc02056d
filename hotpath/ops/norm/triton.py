"""RMSNorm kernels, and LayerNorm fused with the residual add: one program per row. They round where the reference rounds (the sum to the
input dtype, the normalised row to the input dtype before the weight), so they agree with it to
the last bit in most elements."""

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
    tl_dtype,
)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    HAS_RESIDUAL: tl.constexpr,
    SUM_DTYPE: tl.constexpr,  # the dtype x + residual is rounded to (the reference's)
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # no kernel writes it
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(SUM_DTYPE)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x, residual, weight, eps):
    hidden = x.shape[-1]
    x2 = _rows(x)
    r2 = _rows(residual) if residual is not None else x2
    sum_dtype = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
    out_dtype = torch.promote_types(weight.dtype, sum_dtype)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    summed = torch.empty(x2.shape, dtype=sum_dtype, device=x.device) if residual is not None else out
    if x2.shape[0] > 0:
        block = triton.next_power_of_2(hidden)
        use_pdl = pdl_enabled(x.device)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out, summed, hidden, eps,
            x2.stride(0), r2.stride(0), out.stride(0), summed.stride(0),
            HAS_RESIDUAL=residual is not None, SUM_DTYPE=tl_dtype(sum_dtype), BLOCK=block,
            USE_PDL=use_pdl, num_warps=row_warps(block), **pdl_launch(use_pdl),
        )
    return out.view(x.shape[:-1] + (hidden,)), summed.view(x.shape[:-1] + (hidden,))


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] (any leading dims)
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual), like the reference."""
    return _launch(x, residual, weight, eps)


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,  # [T, H, D], strides (stride_xt, stride_xh, 1)
    gate_ptr,  # [T, H, D], strides (stride_gt, stride_gh, 1)
    weight_ptr,  # [D]
    out_ptr,  # [T, H * D]
    H,
    D,
    eps,
    stride_xt,
    stride_xh,
    stride_gt,
    stride_gh,
    ROWS: tl.constexpr,  # heads a program normalises
    BLOCK_D: tl.constexpr,
    WEIGHT_DTYPE: tl.constexpr,  # weight * normed rounds to the promoted dtype, as the reference
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    rh = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rd = tl.arange(0, BLOCK_D)
    mask = (rh < H)[:, None] & (rd < D)[None, :]
    w = tl.load(weight_ptr + rd, mask=rd < D, other=0.0)  # no kernel writes it
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + t * stride_xt + rh[:, None] * stride_xh + rd[None, :], mask=mask, other=0.0)
    z = tl.load(gate_ptr + t * stride_gt + rh[:, None] * stride_gh + rd[None, :], mask=mask,
                other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 1) / D + eps)  # [ROWS]
    normed = (xf * rstd[:, None]).to(x.dtype)
    scaled = (w[None, :].to(WEIGHT_DTYPE) * normed.to(WEIGHT_DTYPE)).to(tl.float32)
    out = scaled * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + t * H * D + rh[:, None] * D + rd[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def gated_rms_norm(
    x: torch.Tensor,  # [T, H, D]
    gate: torch.Tensor,  # [T, H, D]
    weight: torch.Tensor,  # [D]
    eps: float,
) -> torch.Tensor:  # [T, H * D] in x's dtype
    T, H, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    out = torch.empty((T, H * D), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    block_d = triton.next_power_of_2(D)
    rows = max(1, min(triton.next_power_of_2(H), 2048 // block_d))  # ~2K elements a program
    use_pdl = pdl_enabled(x.device)
    _gated_rms_norm_kernel[(T, triton.cdiv(H, rows))](
        x, gate, weight, out, H, D, eps, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        ROWS=rows, BLOCK_D=block_d, WEIGHT_DTYPE=tl_dtype(torch.promote_types(weight.dtype, x.dtype)),
        USE_PDL=use_pdl, num_warps=4, **pdl_launch(use_pdl),
    )
    return out


@triton.jit
def _add_layer_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    sum_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
    x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the residual stream, rounded as the reference's
    tl.store(sum_ptr + row * hidden + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean = tl.sum(xf, 0) / hidden
    centred = tl.where(mask, xf - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, 0) / hidden + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (centred * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)


def fused_add_layer_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden], x's dtype
    weight: torch.Tensor,  # [hidden]
    bias: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (layer_norm(x + residual), x + residual) in x's dtype, like the reference."""
    assert x.dtype == residual.dtype, (x.dtype, residual.dtype)
    hidden = x.shape[-1]
    x2, r2 = _rows(x), _rows(residual)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0:
        block = triton.next_power_of_2(hidden)
        _add_layer_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, bias, out, summed, hidden, eps, x2.stride(0), r2.stride(0),
            BLOCK=block, num_warps=row_warps(block),
        )
    return out.view(x.shape), summed.view(x.shape)
