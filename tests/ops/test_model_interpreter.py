"""The whole model through the Triton kernels on the CPU, under TRITON_INTERPRET=1: greedy decode
(steps of a few tokens take the decode forward that folds the RMSNorms into the GEMVs, see
DecoderLayer.forward_few_rows) gives the reference ops' tokens and logprobs, one sequence at a time
and several at once."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.ops import backend


def greedy(path, prompts, ops_backend, together):
    previous = backend.get_backend()
    backend.set_backend(ops_backend)
    try:
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32",
                  max_model_len=128, num_gpu_blocks_override=32)
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
        batches = [prompts] if together else [[p] for p in prompts]
        outs = [o for b in batches
                for o in llm.generate([{"prompt_token_ids": p} for p in b], params, use_tqdm=False)]
    finally:
        backend.set_backend(previous)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("name", ["qwen3-gqa8-untied-hd", "qwen2-gqa4-tied", "qwen3moe-e5-top2-norm",
                                  "qwen3next-hybrid", "qwen3_5-dense"])
def test_few_rows_decode_matches_reference(name, together, tiny_model_factory, interpreter,
                                           monkeypatch):
    """Decode steps take the fused chain (dense blocks, sparse blocks with a shared expert,
    self-attention and Gated DeltaNet mixers); a routed-only sparse block (Qwen3-MoE) keeps the
    plain forward, through the MoE kernels."""
    from hotpath.models import decoder

    # a vocabulary of 128 (the shared tiny checkpoints' is 512): the LM head's GEMV takes the same
    # path at a quarter of the interpreted programs
    path, hf_model = tiny_model_factory(name, vocab_size=128)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
               for n in (1, 7)]
    want = greedy(path, prompts, "reference", together)
    rows = []
    original = decoder.DecoderModel.forward_few_rows
    monkeypatch.setattr(decoder.DecoderModel, "forward_few_rows",
                        lambda self, ids, *args: rows.append(ids.shape[0]) or original(self, ids, *args))
    got = greedy(path, prompts, "triton", together)
    # three decode steps a sequence: of one row each, or of both sequences at once (short
    # prompts' prefills take the same forward)
    if name.startswith("qwen3moe"):
        assert not rows
    else:
        assert rows.count(2) >= 3 if together else rows.count(1) >= 6
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        for step, tok in enumerate(got_ids):
            assert abs(got_lps[step][tok].logprob - want_lps[step][tok].logprob) < 1e-4
