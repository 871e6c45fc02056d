"""The token bitmask kernel against the reference, and the reference against the bits it reads."""

import pytest
import torch

from hotpath.ops import bitmask as ops
from hotpath.ops.bitmask import reference
from ops_cases import cuda


def case(num_rows: int, vocab: int, masked: list[int], words: int, device: str, dtype=torch.float32):
    g = torch.Generator().manual_seed(vocab + num_rows)
    logits = (torch.randn(num_rows, vocab, generator=g) * 4).to(device, dtype)  # [num_rows, vocab]
    # [num_masked, words]: random bits, some rows nearly all refused, some nearly all allowed
    bits = torch.randint(0, 2, (len(masked), words * 32), generator=g, dtype=torch.int64)
    if len(masked) > 1:
        bits[0] &= torch.randint(0, 2, (words * 32,), generator=g) & torch.randint(0, 2, (words * 32,), generator=g)
        bits[1] |= torch.randint(0, 2, (words * 32,), generator=g)
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    bitmask = (bits.view(len(masked), words, 32) * weights).sum(-1)
    bitmask = torch.where(bitmask >= 1 << 31, bitmask - (1 << 32), bitmask).to(torch.int32).to(device)
    rows = torch.tensor(masked, dtype=torch.int64, device=device)
    return logits, bitmask, rows, bits


def test_reference_reads_the_bits():
    logits, bitmask, rows, bits = case(4, 70, [2, 0], 3, "cpu")
    out = logits.clone()
    reference.apply_token_bitmask(out, bitmask, rows)
    for i, row in enumerate([2, 0]):
        for t in range(70):
            assert out[row, t] == (logits[row, t] if bits[i, t] else float("-inf"))
    assert torch.equal(out[[1, 3]], logits[[1, 3]])  # rows without a mask keep their logits


def test_tokens_past_the_mask_are_refused():
    logits, bitmask, rows, _ = case(2, 100, [1], 2, "cpu")  # 64 bits for 100 tokens
    reference.apply_token_bitmask(logits, bitmask, rows)
    assert torch.isneginf(logits[1, 64:]).all()


@pytest.mark.parametrize("num_rows, vocab, masked, words", [
    (1, 33, [0], 2), (5, 5000, [4, 1, 2], 157), (3, 9000, [], 282), (6, 4096 + 31, [5, 0], 128)])
def test_interpreter(num_rows, vocab, masked, words, interpreter):
    logits, bitmask, rows, _ = case(num_rows, vocab, masked, words, "cpu")
    want = logits.clone()
    reference.apply_token_bitmask(want, bitmask, rows)
    ops.apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, want)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_rows, masked", [(1, [0]), (64, list(range(0, 64, 3))), (256, list(range(256)))])
def test_cuda(num_rows, masked, dtype, gpu_triton):
    vocab = 151936
    logits, bitmask, rows, _ = case(num_rows, vocab, masked, (vocab + 31) // 32, "cuda", dtype)
    want = logits.clone()
    reference.apply_token_bitmask(want, bitmask, rows)
    ops.apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, want)
