"""The decode graphs' packed inputs: one host list, one copy, and every graph's views read the
values the step meant, whatever the graph size, the batch before it and the table widths."""

import torch

from hotpath.engine.sequence import Sequence
from hotpath.runner.decode_inputs import OUT_SLOTS, DecodeInputs
from hotpath.sampling_params import SamplingParams

BLOCK = 4
SCRATCH = 99


def seq(seq_id: int, prompt: list[int], output: list[int], table: list[int]) -> Sequence:
    s = Sequence(seq_id=seq_id, request_id=str(seq_id), index=0, prompt_token_ids=prompt,
                 params=SamplingParams(), max_tokens=100, stop_token_ids=set())
    s.output_token_ids = list(output)
    s.block_table = list(table)
    s.num_computed_tokens = s.num_tokens - 1  # a decode: the last token is the one to compute
    return s


def check(inputs: DecodeInputs, seqs: list[Sequence], size: int) -> None:
    ids, positions, batch = inputs.views(size, max_context_len=64)
    n = len(seqs)
    pad = size - n
    want_pos = [s.num_tokens - 1 for s in seqs]
    assert ids[:n].tolist() == [s.all_token_ids[-1] for s in seqs]
    assert positions.tolist() == want_pos + [0] * pad
    assert batch.context_lens.tolist() == [p + 1 for p in want_pos] + [1] * pad
    assert batch.slot_mapping.tolist() == (
        [s.block_table[p // BLOCK] * BLOCK + p % BLOCK for s, p in zip(seqs, want_pos)]
        + [SCRATCH * BLOCK] * pad
    )
    for i, s in enumerate(seqs):
        assert batch.block_tables[i, : len(s.block_table)].tolist() == s.block_table
    assert all(batch.block_tables[i, 0] == SCRATCH for i in range(n, size))
    assert batch.cu_query_lens.tolist() == list(range(size + 1))
    assert positions.dtype == batch.slot_mapping.dtype == ids.dtype == torch.int64
    assert batch.context_lens.dtype == batch.block_tables.dtype == torch.int32


def test_steps_of_changing_sizes_and_tables(monkeypatch):
    inputs = DecodeInputs(max_rows=8, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                          device=torch.device("cpu"))
    copies = []
    copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, **kw: copies.append(1) or copy(self, src, **kw))
    a = seq(0, [5, 6, 7], [8, 9], [3, 4])
    b = seq(1, list(range(10, 21)), [], [0, 1, 2])
    c = seq(2, [1], [2, 3, 4, 5, 6, 7, 8, 9, 10], [7, 8, 9])

    inputs.fill([a, b, c], 4)
    check(inputs, [a, b, c], 4)
    assert len(copies) == 2  # the packed inputs, then the block tables moved into place

    for s, tok in ((a, 11), (b, 12), (c, 13)):  # a decode step later, same tables
        s.output_token_ids.append(tok)
        s.num_computed_tokens += 1
    copies.clear()
    inputs.fill([a, b, c], 4)
    check(inputs, [a, b, c], 4)
    assert len(copies) == 1  # tables unchanged: the one copy

    b.block_table.append(5)  # b needs a new block; a finished: rows shrink to a smaller graph
    inputs.fill([c, b], 2)
    check(inputs, [c, b], 2)
    inputs.fill([c], 1)
    check(inputs, [c], 1)
    inputs.fill([b, c, a], 8)  # a bigger graph again: its padding rows must not keep old tables
    check(inputs, [b, c, a], 8)


def test_token_ids_from_the_previous_step():
    """Async scheduling: the ids come from the previous step's sampled ids on the device, in place
    when the rows did not move, gathered when they did, or from an eager step's tensor."""
    inputs = DecodeInputs(max_rows=8, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                          device=torch.device("cpu"))
    a, b, c = (seq(i, [5, 6, 7], [8], [3 + i]) for i in range(3))
    inputs.fill([a, b, c], 4)
    inputs.token_ids[:4] = torch.tensor([100, 101, 102, 103])  # what the graph sampled
    ids, _, _ = inputs.views(2, max_context_len=64)
    inputs.fill([a, b], 2, (inputs.token_ids[:3], [0, 1]))
    assert ids.tolist() == [100, 101]
    inputs.fill([c, a], 2, (inputs.token_ids[:3], [2, 0]))
    assert ids.tolist() == [102, 100]
    inputs.fill([b, c], 2, (torch.tensor([7, 8, 9]), [2, 0]))
    assert ids.tolist() == [9, 7]
    check_positions = inputs.views(2, max_context_len=64)[1]
    assert check_positions.tolist() == [b.num_computed_tokens, c.num_computed_tokens]


def test_out_slot_reaches_every_graph_size():
    """The host ring row a step names is what its graph's sampling reads, whatever the size; a
    step that names none writes to the spare row; rows go out and come back one at a time."""
    inputs = DecodeInputs(max_rows=8, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                          device=torch.device("cpu"))
    a, b, c = (seq(i, [5, 6, 7], [8], [3 + i]) for i in range(3))
    taken = [inputs.take_slot() for _ in range(OUT_SLOTS)]
    assert sorted(taken) == list(range(OUT_SLOTS)) and inputs.take_slot() is None
    for size, slot in ((4, taken[0]), (1, taken[1]), (8, None)):
        seqs = [a, b, c][: min(size, 3)]
        inputs.fill(seqs, size, slot=slot)
        check(inputs, seqs, size)
        slot_view, host_ids, host_logprobs = inputs.host_out(size)
        assert slot_view.item() == (OUT_SLOTS if slot is None else slot)
        assert host_ids.shape == host_logprobs.shape == (OUT_SLOTS + 1, size)
    inputs.release_slot(taken[1])
    assert inputs.take_slot() == taken[1]


def test_state_slots_of_a_hybrid_model():
    """A hybrid model's inputs carry each row's state slot, padding rows the scratch slot, for
    every graph size; the other sections read what they read without state slots. A dense model's
    inputs have none."""
    scratch_slot = 8
    inputs = DecodeInputs(max_rows=8, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                          device=torch.device("cpu"), scratch_state_slot=scratch_slot)
    a, b, c = (seq(i, [5, 6], [8] * i, [3 + i]) for i in range(3))
    for s, slot in ((a, 5), (b, 0), (c, 7)):
        s.state_slot = slot
    for seqs, size in (([a, b, c], 4), ([c], 1), ([b, a], 2), ([c, a, b], 8)):
        inputs.fill(seqs, size)
        check(inputs, seqs, size)
        _, _, batch = inputs.views(size, max_context_len=64)
        assert batch.state_slots.dtype == torch.int64
        assert batch.state_slots.tolist() == [s.state_slot for s in seqs] + [scratch_slot] * (size - len(seqs))
        assert batch.state_saves is None
    # async scheduling: the ids from the device, the state slots from the host as before
    inputs.token_ids[:2] = torch.tensor([40, 41])
    inputs.fill([b, a], 2, (inputs.token_ids[:2], [1, 0]))
    ids, _, batch = inputs.views(2, max_context_len=64)
    assert ids.tolist() == [41, 40] and batch.state_slots.tolist() == [0, 5]

    dense = DecodeInputs(max_rows=8, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                         device=torch.device("cpu"))
    dense.fill([a, b], 2)
    assert dense.views(2, max_context_len=64)[2].state_slots is None
    assert dense.ids_offset == inputs.ids_offset - 2 * 8  # the section takes room only in a hybrid's


def test_rows_of_several_tokens():
    """Rows of q tokens (speculative steps' graphs): each row's q positions, slots through its
    block table and tokens (a shorter row padded with its last token), contexts ending at the
    row's last position; padding rows take q tokens of the scratch block."""
    q = 3
    inputs = DecodeInputs(max_rows=4, max_blocks=6, scratch_block=SCRATCH, block_size=BLOCK,
                          device=torch.device("cpu"), query_len=q)
    a = seq(0, [5, 6, 7], [8, 9], [3, 4])
    b = seq(1, list(range(10, 21)), [], [0, 1, 2, 5])  # blocks for its padding too
    rows = [(4, [9, 30, 31]), (10, [20])]  # a verifies two drafts; b none (padded)
    inputs.fill([a, b], 4, rows=rows)
    ids, positions, batch = inputs.views(4, max_context_len=64)
    assert ids.tolist() == [9, 30, 31, 20, 20, 20] + [0] * 6
    assert positions.tolist() == [4, 5, 6, 10, 11, 12] + [0, 1, 2] * 2
    assert batch.context_lens.tolist() == [7, 13, q, q]
    table = {0: a.block_table, 1: b.block_table}
    want_slots = [table[i][p // BLOCK] * BLOCK + p % BLOCK for i, first in ((0, 4), (1, 10))
                  for p in range(first, first + q)]
    assert batch.slot_mapping.tolist() == want_slots + [SCRATCH * BLOCK + j for j in range(q)] * 2
    assert batch.cu_query_lens.tolist() == [0, 3, 6, 9, 12]
    assert batch.max_query_len == q and batch.logits_indices.tolist() == list(range(12))
    assert batch.block_tables[0, :2].tolist() == a.block_table and batch.block_tables[2, 0] == SCRATCH
