"""The tiny GGUF (tests/tiny_gguf.py: every kept type, a fused layer of two types) kept quantized
through the Triton kernels on the CPU, under TRITON_INTERPRET=1: the decode steps take the fused
chain, and greedy decode gives the reference ops' tokens and logprobs."""

from tiny_gguf import make_tiny_gguf_dir

from hotpath import LLM, SamplingParams
from hotpath.ops import backend


def greedy(path, ops_backend):
    previous = backend.get_backend()
    backend.set_backend(ops_backend)
    try:
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=64,
                  num_gpu_blocks_override=16, quantization="gguf")
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logprobs=1)
        outs = llm.generate([{"prompt_token_ids": p} for p in ([5, 17, 33, 90, 4], [7])], params,
                            use_tqdm=False)
    finally:
        backend.set_backend(previous)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def test_gguf_model_through_the_kernels(tmp_path, monkeypatch, interpreter):
    from hotpath.models import decoder

    path = make_tiny_gguf_dir(tmp_path, monkeypatch)
    want = greedy(path, "reference")
    rows = []
    original = decoder.DecoderModel.forward_few_rows
    monkeypatch.setattr(decoder.DecoderModel, "forward_few_rows",
                        lambda self, ids, *args: rows.append(ids.shape[0]) or original(self, ids, *args))
    got = greedy(path, "triton")
    assert rows.count(2) >= 1  # the two sequences' decode step, together
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        for step, tok in enumerate(got_ids):
            assert abs(got_lps[step][tok].logprob - want_lps[step][tok].logprob) < 1e-4
