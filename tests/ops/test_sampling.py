"""The greedy sampling kernel (argmax + its logprob per row) against the torch reference: the same
token (the lowest index among equal maxima, as torch.argmax), the logprob within rounding."""

import pytest
import torch

from hotpath.ops import sampling
from hotpath.ops.sampling import reference
from ops_cases import cuda


def check(logits: torch.Tensor, **kwargs) -> None:
    ids, logprobs = kernel(logits, **kwargs)
    want_ids, want_logprobs = reference.greedy_sample(logits.float())
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-5, atol=1e-5)


def kernel(logits, chunk=None, out=None):
    if chunk is None:
        return sampling.greedy_sample(logits, out)
    from hotpath.ops.sampling import triton as kernels

    return kernels.greedy_sample(logits, out, chunk=chunk)


def with_ties(rows: int, vocab: int, positions: list[int], seed: int = 0) -> torch.Tensor:
    """Random rows whose maximum occurs at every index in `positions` (exact ties)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    logits[:, positions] = logits.max() + 1.0
    return logits


@pytest.mark.parametrize("rows,vocab,chunk", [(1, 512, None), (3, 1000, 256), (5, 777, 128), (2, 64, 64)])
def test_interpreter_random(rows, vocab, chunk, interpreter, poisoned):
    g = torch.Generator().manual_seed(rows)
    check(torch.randn(rows, vocab, generator=g) * 5, chunk=chunk)


@pytest.mark.parametrize("positions", [[700, 3], [10, 11], [255, 256], [999, 512, 900]])
def test_interpreter_ties_pick_the_lowest_index(positions, interpreter):
    # chunks of 256 with loads of 128: ties inside one load, across loads and across chunks
    logits = with_ties(2, 1000, positions)
    ids, _ = kernel(logits, chunk=256)
    assert ids.tolist() == [min(positions)] * 2 == logits.argmax(-1).tolist()


def test_interpreter_minus_inf_and_strided_rows(interpreter):
    # a row view with a stride past the vocabulary, and whole chunks masked to -inf
    wide = torch.randn(3, 1200)
    logits = wide[:, :1000]
    logits[0, :512] = float("-inf")
    logits[1, 256:] = float("-inf")
    check(logits, chunk=256)


def test_interpreter_bf16_logits(interpreter):
    logits = (torch.randn(2, 700) * 3).to(torch.bfloat16)
    check(logits, chunk=128)


def test_interpreter_writes_into_out(interpreter, poisoned):
    logits = torch.randn(4, 300)
    ids, logprobs = torch.zeros(8, dtype=torch.int64), torch.empty(8)
    got = kernel(logits, chunk=128, out=(ids[:4], logprobs[:4]))
    assert got[0].data_ptr() == ids.data_ptr() and got[1].data_ptr() == logprobs.data_ptr()
    check(logits, chunk=128)
    assert torch.equal(ids[:4], logits.argmax(-1)) and not ids[4:].any()


def host_out_case(rows: int, device: str):
    """Logits, a ring of 4 host rows (wider than the batch, poisoned) and the slot 2 on `device`."""
    logits = torch.randn(rows, 3000, device=device) * 4
    pin = device == "cuda"
    ring = (torch.full((4, rows + 3), -7, dtype=torch.int64, pin_memory=pin),
            torch.full((4, rows + 3), float("nan"), pin_memory=pin))
    return logits, torch.tensor([2], dtype=torch.int32, device=device), ring


def check_host_out(logits, slot, ring) -> None:
    """The kernel's tokens in ring row 2, the same as its device outputs; nothing else written."""
    rows = logits.shape[0]
    ids, logprobs = sampling.greedy_sample(logits, host_out=(slot, ring[0][:, :rows], ring[1][:, :rows]))
    if logits.is_cuda:
        torch.cuda.synchronize()
    assert torch.equal(ring[0][2, :rows], ids.cpu()) and torch.equal(ring[1][2, :rows], logprobs.cpu())
    assert torch.equal(ids.cpu(), logits.argmax(-1).cpu())
    rest = torch.ones(4, rows + 3, dtype=torch.bool)
    rest[2, :rows] = False
    assert (ring[0][rest] == -7).all() and ring[1][rest].isnan().all()


def test_interpreter_writes_the_host_ring(interpreter):
    check_host_out(*host_out_case(3, "cpu"))


def test_reference_writes_the_host_ring():
    check_host_out(*host_out_case(3, "cpu"))


@cuda
@pytest.mark.parametrize("rows", [1, 5])
def test_cuda_writes_mapped_host_memory(rows, gpu_triton):
    """The kernel stores straight into pinned host memory, in a CUDA graph as the decode graphs do."""
    logits, slot, ring = host_out_case(rows, "cuda")
    check_host_out(logits, slot, ring)  # compiles outside the capture
    ring[0].fill_(-7)
    ring[1].fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, logprobs = sampling.greedy_sample(logits, host_out=(slot, ring[0][:, :rows], ring[1][:, :rows]))
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(ring[0][2, :rows], logits.argmax(-1).cpu())
    torch.testing.assert_close(ring[1][2, :rows], logprobs.cpu(), rtol=0, atol=0)


@cuda
def test_cuda_nan_row_gives_an_index_in_range(gpu_triton):
    # (not under the interpreter: it reduces all-NaN slices with numpy, which raises)
    logits = torch.full((2, 3000), float("nan"), device="cuda")
    logits[1, :1000] = 0.0
    ids, _ = kernel(logits)
    assert all(0 <= i < 3000 for i in ids.tolist())


def test_reference_matches_log_softmax():
    logits = torch.randn(3, 50)
    ids, logprobs = reference.greedy_sample(logits)
    assert torch.equal(ids, logits.argmax(-1))
    assert torch.equal(logprobs, torch.log_softmax(logits, -1).gather(1, ids[:, None]).squeeze(1))


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab", [(1, 151936), (7, 151936), (64, 32000), (3, 1000)])
def test_cuda(rows, vocab, dtype, gpu_triton, poisoned):
    g = torch.Generator().manual_seed(rows)
    check((torch.randn(rows, vocab, generator=g) * 4).to("cuda", dtype))


@cuda
def test_cuda_ties(gpu_triton):
    logits = with_ties(4, 151936, [151935, 70000, 2049, 2048]).cuda()
    ids, _ = kernel(logits)
    assert ids.tolist() == [2048] * 4 == logits.argmax(-1).tolist()
