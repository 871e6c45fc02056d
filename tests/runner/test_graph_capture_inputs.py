"""What the decode graphs' warm-up forward runs on. The warm-up executes every kernel once before
the capture records it; it must see padding rows as a replay does (a context of one key in the
scratch block), not the static buffer's initial contents: a context of 0 keys puts the query at
position -1, whose cos/sin row lies before the table (an out-of-bounds read on the GPU)."""

import torch

from hotpath import LLM


def test_warm_up_sees_padding_rows(tiny_model_factory):
    path, _ = tiny_model_factory("qwen3-gqa8-untied-hd")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256, max_num_seqs=8)
    runner = llm.engine.executor.runner
    seen = []

    def capture(forward):
        logits = forward()  # [bs, vocab]; writes only the token ids of the inputs
        bs = logits.shape[0]
        _, positions, batch = runner.decode_inputs.views(bs, 256)
        seen.append((bs, batch.context_lens.clone(), positions.clone(), batch.slot_mapping.clone(),
                     batch.block_tables.clone()))
        return type("Graph", (), {"replay": staticmethod(forward)})(), logits

    runner._capture_decode_graphs(capture=capture)
    assert [s[0] for s in seen] == [8, 4, 2, 1]  # largest first
    scratch = runner.scratch_block
    for bs, ctx, pos, slots, tables in seen:
        assert torch.equal(ctx, torch.ones(bs, dtype=ctx.dtype)), (bs, ctx)
        assert torch.equal(pos, torch.zeros(bs, dtype=pos.dtype))
        assert torch.equal(slots, torch.full((bs,), scratch * runner.block_size, dtype=slots.dtype))
        assert (tables[:, 0] == scratch).all()


def test_hybrid_warm_up_sees_the_scratch_state_slot(tiny_model_factory):
    """A hybrid model's graphs are captured on padding rows whose state slot is the scratch slot:
    one past the slots the cache manager hands out, allocated in every linear-attention layer's
    pool, and starting from zero states (a context of 1), so padding never touches a sequence's."""
    path, _ = tiny_model_factory("qwen3next-hybrid")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256, max_num_seqs=4)
    runner = llm.engine.executor.runner
    assert not runner.graphs  # no graphs on the CPU but through a stand-in capture
    scratch = runner.scratch_state_slot
    assert scratch == runner.num_state_slots == 4
    assert scratch not in llm.engine.kv_cache.free_state_slots
    for layer in runner.state_layers:
        assert all(pool.shape[0] == scratch + 1 for pool in layer.state)
    seen = []

    def capture(forward):
        logits = forward()
        bs = logits.shape[0]
        _, _, batch = runner.decode_inputs.views(bs, 256)
        seen.append((bs, batch.state_slots.clone(), batch.context_lens.clone()))
        return type("Graph", (), {"replay": staticmethod(forward)})(), logits

    runner._capture_decode_graphs(capture=capture)
    assert [s[0] for s in seen] == [4, 2, 1]
    for bs, state_slots, ctx in seen:
        assert torch.equal(state_slots, torch.full((bs,), scratch, dtype=torch.int64))
        assert torch.equal(ctx, torch.ones(bs, dtype=ctx.dtype))
    # the warm-ups wrote the scratch slot only
    for layer in runner.state_layers:
        assert all(not pool[:scratch].any() and pool[scratch].any() for pool in layer.state)
