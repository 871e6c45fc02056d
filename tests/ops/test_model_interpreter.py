"""The whole model through the Triton kernels on the CPU, under TRITON_INTERPRET=1: greedy decode
(one-token steps take the decode forward that folds the RMSNorms into the GEMVs, see
DecoderLayer.forward_one_row) gives the reference ops' tokens and logprobs."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.ops import backend


def greedy(path, prompts, ops_backend):
    previous = backend.get_backend()
    backend.set_backend(ops_backend)
    try:
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32",
                  max_model_len=128, num_gpu_blocks_override=32)
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
        # one at a time: a decode step of one sequence is one row
        outs = [llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0] for p in prompts]
    finally:
        backend.set_backend(previous)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize("name", ["qwen3-gqa8-untied-hd", "qwen2-gqa4-tied"])
def test_one_row_decode_matches_reference(name, tiny_model_factory, interpreter, monkeypatch):
    from hotpath.models import llama

    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in (1, 7)]
    want = greedy(path, prompts, "reference")
    one_row_steps = []
    original = llama.DecoderModel._forward_one_row
    monkeypatch.setattr(llama.DecoderModel, "_forward_one_row",
                        lambda *a: one_row_steps.append(1) or original(*a))
    got = greedy(path, prompts, "triton")
    assert one_row_steps, "no step took the one-row decode forward"
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        for step, tok in enumerate(got_ids):
            assert abs(got_lps[step][tok].logprob - want_lps[step][tok].logprob) < 1e-4
