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


@pytest.mark.parametrize("merge_in_o_proj", [True, False])
@pytest.mark.parametrize("name", ["qwen3-gqa8-untied-hd", "qwen2-gqa4-tied"])
def test_one_row_decode_matches_reference(name, merge_in_o_proj, tiny_model_factory, interpreter,
                                          monkeypatch):
    """Both one-row forms: attention's splits merged by o_proj, whose sums gate_up adds into the
    residual stream (the default), and merged by attention itself."""
    from hotpath.models import llama
    from hotpath.ops.attention import triton_out_proj

    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in (1, 7)]
    want = greedy(path, prompts, "reference")
    calls = {"one_row": 0, "merge_in_o_proj": 0}

    def counted(key, fn):
        return lambda *a, **kw: calls.__setitem__(key, calls[key] + 1) or fn(*a, **kw)

    monkeypatch.setattr(llama.DecoderModel, "_forward_one_row",
                        counted("one_row", llama.DecoderModel._forward_one_row))
    monkeypatch.setattr(triton_out_proj, "merge_and_project",
                        counted("merge_in_o_proj", triton_out_proj.merge_and_project))
    monkeypatch.setattr(llama.DecoderLayer, "merge_splits_in_o_proj", merge_in_o_proj)
    monkeypatch.setattr(triton_out_proj, "pays", lambda *a: True)  # (the interpreter has 4 "SMs")
    got = greedy(path, prompts, "triton")
    assert calls["one_row"], "no step took the one-row decode forward"
    assert bool(calls["merge_in_o_proj"]) == merge_in_o_proj
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        for step, tok in enumerate(got_ids):
            assert abs(got_lps[step][tok].logprob - want_lps[step][tok].logprob) < 1e-4
