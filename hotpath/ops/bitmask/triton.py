"""The token bitmask applied to logits in one launch: a program per (masked row, block of the
vocabulary) reads the block's mask words and writes -inf where a token is refused, in place, so
rows without a mask are never touched and the logits never move."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # vocabulary entries per program (151,936 -> 38 programs per masked row)


@triton.jit
def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, vocab, stride_logits, stride_mask, words,
                          BLOCK: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i).to(tl.int64)
    in_vocab = cols < vocab
    word = tl.load(bitmask_ptr + i.to(tl.int64) * stride_mask + cols // 32,
                   mask=in_vocab & (cols // 32 < words), other=0)
    refused = ((word >> (cols % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_logits + cols, tl.full((BLOCK,), float("-inf"), tl.float32)
             .to(logits_ptr.dtype.element_ty), mask=in_vocab & refused)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """As reference.apply_token_bitmask: logits [num_rows, vocab], bitmask [num_masked, words]
    int32, rows [num_masked] int64, on one device; -inf written in place."""
    if rows.numel() == 0:
        return
    assert logits.stride(1) == 1 and bitmask.stride(1) == 1 and bitmask.dtype == torch.int32
    vocab = logits.shape[1]
    grid = (rows.numel(), triton.cdiv(vocab, BLOCK))
    _apply_bitmask_kernel[grid](logits, bitmask, rows, vocab, logits.stride(0), bitmask.stride(0),
                                bitmask.shape[1], BLOCK=BLOCK)
