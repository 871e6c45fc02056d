"""The decode-graph path of the runner (static buffers, sampling captured after the LM head),
run on the CPU: a stand-in replays the captured forward eagerly, so everything but the CUDA graph
itself is the code a GPU runs."""

import pytest
import torch

from hotpath import LLM, SamplingParams

MODEL = "qwen3-gqa8-untied-hd"


class EagerReplay:
    """A CUDA graph stand-in: replay() reruns the forward, writing into the captured outputs."""

    def __init__(self, forward):
        self.forward = forward
        self.logits = forward()

    def replay(self) -> None:
        self.logits.copy_(self.forward())


def eager_capture(forward):
    graph = EagerReplay(forward)
    return graph, graph.logits


def make_llm(path, graphs: bool, **kwargs) -> LLM:
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256, max_num_seqs=8,
              **kwargs)
    if graphs:
        llm.engine.runner._capture_decode_graphs(capture=eager_capture)
    return llm


@pytest.fixture(scope="module")
def prompts(tiny_model_factory):
    path, hf_model = tiny_model_factory(MODEL)
    g = torch.Generator().manual_seed(5)
    return path, [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
                  for n in (3, 17, 40)]


def generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[(c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason) for c in o.outputs]
            for o in outs]


PLAIN = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
SAMPLED = [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=3, logprobs=0),
]


def test_plain_greedy_decode_skips_the_sampler(prompts, monkeypatch):
    path, ps = prompts
    want = generate(make_llm(path, graphs=False), ps, PLAIN)
    llm = make_llm(path, graphs=True)
    calls = []
    sampler = llm.engine.runner.sampler
    monkeypatch.setattr(llm.engine.runner, "sampler", lambda *a: calls.append(len(a[0])) or sampler(*a))
    assert generate(llm, ps, PLAIN) == want
    # only the prefill steps sampled eagerly (a graph replays decodes of up to 8 rows)
    assert calls and sum(calls) == len(ps)


@pytest.mark.parametrize("params", SAMPLED)
def test_other_rows_sample_the_graph_logits(prompts, params):
    path, ps = prompts
    mixed = [params, PLAIN, params]
    want = generate(make_llm(path, graphs=False), ps, mixed)
    assert generate(make_llm(path, graphs=True), ps, mixed) == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_greedy_matches_the_sampler(prompts, dtype):
    """The Triton argmax + logprob captured in the graph against the eager Sampler on the same
    graph logits (logprobs=1 sends a row through the Sampler)."""
    path, ps = prompts
    llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype=dtype, max_model_len=256,
              max_num_seqs=8)
    assert llm.engine.runner.graphs
    top1 = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    for plain, sampled in zip(generate(llm, ps, PLAIN), generate(llm, ps, top1)):
        ids, _, lps, _ = plain[0]
        want_ids, _, want_lps, _ = sampled[0]
        assert ids == want_ids
        for t, got, want in zip(ids, lps, want_lps):
            assert abs(got[t].logprob - want[t].logprob) < 1e-4
