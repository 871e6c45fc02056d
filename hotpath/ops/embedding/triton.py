"""Embedding lookup with each row's sum of squares (one program a row), for decode steps.

It is a step's first kernel, so it is launched without PDL: it starts once everything before it on
the stream is complete, which lets every later kernel of the step read earlier steps' outputs
before its own PDL wait (ops/triton_utils). It still lets the first projection launch at once, so
that projection's weight loads start while the lookup runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch_dependents, row_warps


@triton.jit
def _embedding_kernel(ids_ptr, w_ptr, out_ptr, sumsq_ptr, hidden, stride_w, stride_o,
                      BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_launch_dependents(USE_PDL)
    row = tl.program_id(0)
    token = tl.load(ids_ptr + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(w_ptr + token * stride_w + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + cols, x, mask=mask)
    xf = x.to(tl.float32)
    tl.store(sumsq_ptr + row, tl.sum(xf * xf, 0))


def embedding_with_sumsq(
    input_ids: torch.Tensor,  # [M] int
    weight: torch.Tensor,  # [vocab, hidden], rows contiguous
) -> tuple[torch.Tensor, torch.Tensor]:  # [M, hidden], [1, M] fp32
    if input_ids.dim() != 1 or weight.stride(-1) != 1:
        raise ValueError("embedding_with_sumsq takes 1-D ids and a weight with contiguous rows")
    M, hidden = input_ids.shape[0], weight.shape[1]
    out = torch.empty((M, hidden), dtype=weight.dtype, device=weight.device)
    sumsq = torch.empty((1, M), dtype=torch.float32, device=weight.device)
    if M > 0:
        block = triton.next_power_of_2(hidden)
        # USE_PDL only for the early launch of the next kernel: this one is not launched with PDL
        _embedding_kernel[(M,)](input_ids, weight, out, sumsq, hidden, weight.stride(0),
                                out.stride(0), BLOCK=block, USE_PDL=pdl_enabled(weight.device),
                                num_warps=row_warps(block))
    return out, sumsq
