"""Epilogue pieces the MoE kernels share, rounding as the reference (HF's experts path) does."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_and_mul_rounded(gate, up, dtype: tl.constexpr):
    """silu(gate) * up from fp32 sums of the gate_up projection: the projection rounded to the
    model dtype, silu(gate) rounded again, the product rounded (torch's bf16 ops) -> dtype."""
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def weighted_term(y, weight, dtype: tl.constexpr):
    """One (token, expert) term of the sum over experts, from the fp32 sums of the down
    projection and the fp32 routing weight: both rounded to the model dtype, the product rounded
    to it (HF casts the router's weights to the model dtype) -> fp32."""
    return (y.to(dtype).to(tl.float32) * weight.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
