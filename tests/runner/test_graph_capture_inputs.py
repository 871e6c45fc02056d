"""What the decode graphs' warm-up forward runs on. The warm-up executes every kernel once before
the capture records it; it must see padding rows as a replay does (a context of one key in the
scratch block), not the static buffer's initial contents: a context of 0 keys puts the query at
position -1, whose cos/sin row lies before the table (an out-of-bounds read on the GPU)."""

import torch

from hotpath import LLM


def test_warm_up_sees_padding_rows(tiny_model_factory):
    path, _ = tiny_model_factory("qwen3-gqa8-untied-hd")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256, max_num_seqs=8)
    runner = llm.engine.runner
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
