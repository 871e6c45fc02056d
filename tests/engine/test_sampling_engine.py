"""Sampling features through the whole engine: seeds, n > 1, stop tokens, lengths, logprobs."""

import pytest

from hotpath import LLM, SamplingParams

MODEL = "qwen3-gqa8-untied-hd"
PROMPTS = [{"prompt_token_ids": [5, 9, 200, 31, 7]}, {"prompt_token_ids": list(range(40, 75))}]


@pytest.fixture(scope="module")
def llm(tiny_model_factory):
    path, _ = tiny_model_factory(MODEL)
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=128)


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_same_seed_same_output_whatever_the_batch(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=123, max_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], p, use_tqdm=False)
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    crowded = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[1]], [unseeded, p, unseeded], use_tqdm=False)
    assert tokens(alone)[0] == tokens(crowded)[1]
    other_seed = llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, top_p=0.9, seed=124,
                              max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert tokens(other_seed)[0] != tokens(alone)[0]


def test_n_samples(llm):
    outs = llm.generate(PROMPTS, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10,
                                                ignore_eos=True), use_tqdm=False)
    for out in outs:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert all(len(c.token_ids) == 10 for c in out.outputs)
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # independent samples
    greedy = llm.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=10, ignore_eos=True),
                          use_tqdm=False)
    assert all(o.outputs[0].token_ids == o.outputs[1].token_ids for o in greedy)


def test_stop_token_ids_and_lengths(llm):
    free = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop_at = free.token_ids[6]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                           stop_token_ids=[stop_at]), use_tqdm=False)[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at
    assert stopped.token_ids == free.token_ids[: first + 1]
    # min_tokens holds the stop token back until enough tokens exist
    held = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                        stop_token_ids=[stop_at], min_tokens=first + 2), use_tqdm=False)[0].outputs[0]
    assert len(held.token_ids) >= first + 2
    assert stop_at not in held.token_ids[: first + 1]


def test_eos_stops_unless_ignored(llm):
    free = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    eos = free.token_ids[3]
    llm.engine.eos_token_ids = {eos}  # pretend this token is the model's EOS
    try:
        out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
        assert out[0].outputs[0].token_ids == free.token_ids[: free.token_ids.index(eos) + 1]
        assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].stop_reason is None
    finally:
        llm.engine.eos_token_ids = set()


def test_max_model_len_caps_output(llm):
    prompt = {"prompt_token_ids": [7] * 120}
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 8 and out.finish_reason == "length"


def test_top_logprobs(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, logprobs=3,
                       ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs):
        ranked = sorted((lp.rank, lp.logprob) for lp in entry.values() if lp.rank is not None)
        assert [r for r, _ in ranked] == [1, 2, 3]
        assert ranked[0][1] >= ranked[1][1] >= ranked[2][1]
        assert entry[token].rank == 1  # greedy picks the most likely token
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))
