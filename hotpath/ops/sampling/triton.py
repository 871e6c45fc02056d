"""Greedy sampling in two small launches: argmax and logsumexp of each row in one pass over it.

A row of a large vocabulary (151,936 for Qwen) is split into chunks so a batch of one still spreads
over many SMs: each program reduces one chunk to (max, index of the first max, sum of exp(x - max)),
then one program per row combines its chunks. Both reductions keep the lowest index among equal
maxima (within a chunk through Triton's left tie-break, across chunks by taking the smallest
index whose chunk holds the row maximum), so the token equals torch.argmax's.

With `host_out` the combine also writes each row's token and logprob into host memory the device
maps (pinned, under unified addressing), at the ring row a device scalar names: a decode graph's
tokens reach the host without copies on the stream behind it (runner/decode_inputs.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotpath.ops.triton_utils import pdl_enabled, pdl_launch, pdl_launch_dependents, pdl_wait

BLOCK = 1024  # elements one program loads at a time
CHUNK = 2048  # elements of a row per program (151,936 -> 75 programs per row)


@triton.jit
def _chunk_kernel(
    logits_ptr,
    max_ptr,
    index_ptr,
    sum_ptr,
    vocab,
    stride_row,
    num_chunks,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * CHUNK
    offs = tl.arange(0, BLOCK)
    run_max = tl.full((), float("-inf"), tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    run_index = tl.full((), 0, tl.int32) + start
    pdl_wait(USE_PDL)  # the logits are the previous kernel's
    for b in tl.range(0, CHUNK, BLOCK):
        cols = start + b + offs
        # upcast right after the load: every reduction is in fp32 whatever the logits' dtype
        x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab, other=float("-inf"))
        x = x.to(tl.float32)
        block_max, block_index = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        new_max = tl.maximum(run_max, block_max)
        # a chunk of only -inf (padding past the vocabulary) must not make exp(-inf - -inf) = NaN
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift), 0)
        # strictly greater: an equal maximum in a later block keeps the earlier index
        run_index = tl.where(block_max > run_max, start + b + block_index, run_index)
        run_max = new_max
    out = row * num_chunks + chunk
    tl.store(max_ptr + out, run_max)
    tl.store(index_ptr + out, run_index)
    tl.store(sum_ptr + out, run_sum)


@triton.jit
def _combine_kernel(
    max_ptr,
    index_ptr,
    sum_ptr,
    token_ptr,
    logprob_ptr,
    slot_ptr,  # [1] int32: the host ring row (HOST_OUT)
    host_token_ptr,  # [slots, stride_host] int64 in mapped host memory (HOST_OUT)
    host_logprob_ptr,  # [slots, stride_host] float32 (HOST_OUT)
    stride_host,
    vocab,
    num_chunks,
    BLOCK_CHUNKS: tl.constexpr,
    HOST_OUT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_launch_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_CHUNKS)
    mask = offs < num_chunks
    if HOST_OUT:
        # a step input, written before the forward began: read before the wait
        at = tl.load(slot_ptr).to(tl.int64) * stride_host + row
    else:
        at = row  # unused
    pdl_wait(USE_PDL)  # the partials are the chunk kernel's
    chunk_max = tl.load(max_ptr + row * num_chunks + offs, mask=mask, other=float("-inf"))
    chunk_sum = tl.load(sum_ptr + row * num_chunks + offs, mask=mask, other=0.0)
    chunk_index = tl.load(index_ptr + row * num_chunks + offs, mask=mask, other=vocab)
    row_max = tl.max(chunk_max, 0)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(chunk_sum * tl.exp(chunk_max - shift), 0)
    # chunks are in index order and each holds its first maximum: the smallest such index wins
    token = tl.min(tl.where(chunk_max == row_max, chunk_index, vocab), 0)
    # a row with NaN matches no maximum; keep the index in range so an embedding lookup of it
    # (the next step's input under async scheduling) cannot read out of bounds
    token = tl.minimum(token, vocab - 1)
    logprob = row_max - (shift + tl.log(total))
    tl.store(token_ptr + row, token.to(tl.int64))
    tl.store(logprob_ptr + row, logprob)
    if HOST_OUT:
        tl.store(host_token_ptr + at, token.to(tl.int64))
        tl.store(host_logprob_ptr + at, logprob)


def greedy_sample(
    logits: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    host_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See hotpath.ops.sampling.reference.greedy_sample; `chunk` (a multiple of the load block,
    or smaller than it) is the slice of a row one program reduces."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1, "the vocabulary dimension must be contiguous"
    if out is None:
        out = (torch.empty(rows, dtype=torch.int64, device=logits.device),
               torch.empty(rows, dtype=torch.float32, device=logits.device))
    token_ids, logprobs = out
    assert token_ids.is_contiguous() and logprobs.is_contiguous()
    block = min(BLOCK, triton.next_power_of_2(chunk))
    assert chunk % block == 0, f"chunk {chunk} is not a multiple of the block {block}"
    num_chunks = triton.cdiv(vocab, chunk)
    # [rows, num_chunks] each: the per-chunk partial reductions
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    chunk_index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    chunk_sum = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    # both launched early behind the LM head (PDL), like every other kernel of a decode graph
    use_pdl = pdl_enabled(logits.device)
    _chunk_kernel[(rows, num_chunks)](
        logits, chunk_max, chunk_index, chunk_sum, vocab, logits.stride(0), num_chunks,
        CHUNK=chunk, BLOCK=block, USE_PDL=use_pdl, num_warps=4, **pdl_launch(use_pdl),
    )
    if host_out is None:
        slot, host_ids, host_logprobs = token_ids, token_ids, logprobs  # unused
    else:
        slot, host_ids, host_logprobs = host_out
        assert host_ids.stride() == host_logprobs.stride() and host_ids.stride(1) == 1
    _combine_kernel[(rows,)](
        chunk_max, chunk_index, chunk_sum, token_ids, logprobs, slot, host_ids, host_logprobs,
        host_ids.stride(0), vocab, num_chunks, BLOCK_CHUNKS=triton.next_power_of_2(num_chunks),
        HOST_OUT=host_out is not None, USE_PDL=use_pdl, num_warps=1 if num_chunks <= 128 else 4,
        **pdl_launch(use_pdl),
    )
    return out
