"""The same greedy sequences whatever the batching: one by one, all together, chunked prefill,
prefix-cache hits and preemption must all give identical tokens."""

import pytest
import torch

from hotpath import LLM, SamplingParams

LENGTHS = [5, 33, 70, 16, 48, 91]


@pytest.fixture(scope="module",
                params=["qwen2-gqa4-tied", "qwen3moe-e7-top3-sparse2", "qwen2moe-shared", "qwen3next-hybrid"])
def setup(request, tiny_model_factory):
    path, hf_model = tiny_model_factory(request.param)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    return str(path), prompts


PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
WITH_LOGPROBS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)


def run(path, prompts, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def one_by_one(setup):
    path, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
              enable_prefix_caching=False)
    return [llm.generate({"prompt_token_ids": p}, PARAMS, use_tqdm=False)[0].outputs[0].token_ids
            for p in prompts]


def test_all_together(setup, one_by_one):
    _, together = run(*setup, enable_prefix_caching=False)
    assert together == one_by_one


def test_chunked_prefill(setup, one_by_one):
    # a budget of 20 tokens splits every prompt longer than 20 into chunks across steps
    llm, chunked = run(*setup, max_num_batched_tokens=20, enable_prefix_caching=False)
    assert chunked == one_by_one


def test_prefix_cache_hits(setup, one_by_one):
    path, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256)
    first_outs = llm.generate([{"prompt_token_ids": p} for p in prompts], WITH_LOGPROBS, use_tqdm=False)
    first = [o.outputs[0].token_ids for o in first_outs]
    first_lps = [o.outputs[0].cumulative_logprob for o in first_outs]
    hits_before = llm.engine.kv_cache.prefix_hit_tokens
    # same prompts again, plus prompts that extend a cached prompt + output
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], WITH_LOGPROBS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == one_by_one == first
    # the same probabilities too, not only the same argmax (a hybrid's state restored exactly)
    for o, lp in zip(again, first_lps):
        assert abs(o.outputs[0].cumulative_logprob - lp) < 1e-4
    assert llm.engine.kv_cache.prefix_hit_tokens > hits_before
    for o, p in zip(again, prompts):
        hit = (len(p) - 1) // 16 * 16
        if llm.engine.executor.runner.state_layers and hit != len(p) // 16 * 16:
            # a hybrid: the hit reaches as far as a snapshot of the state, here the prompt's last
            # block boundary (none between it and the start for these short prompts)
            hit = 0
        assert o.num_cached_tokens == hit, (len(p), o.num_cached_tokens)


def test_preemption(setup, one_by_one):
    # 24 blocks of 16 = 384 tokens cannot hold all six sequences (~ 480 tokens) at once
    llm, preempted = run(*setup, num_gpu_blocks_override=24, enable_prefix_caching=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert preempted == one_by_one
    assert llm.engine.kv_cache.num_free_blocks == 24  # everything freed at the end
    assert len(llm.engine.kv_cache.free_state_slots) == llm.engine.executor.runner.num_state_slots


def test_preemption_with_prefix_cache_and_chunks(setup, one_by_one):
    llm, out = run(*setup, num_gpu_blocks_override=24, max_num_batched_tokens=24)
    assert llm.engine.scheduler.num_preemptions > 0
    assert out == one_by_one


def test_mixed_steps_split_attention(setup, one_by_one, monkeypatch):
    """Steps that mix decodes with prefill chunks run attention in two parts (decode rows first,
    ForwardBatch.split), and the tokens stay those of one-by-one decoding."""
    from hotpath.runner.model_runner import ModelRunner

    splits = []
    real = ModelRunner._split_batch

    def spy(self, batch, num_few, cu_query_lens, context_lens, scheduled):
        out = real(self, batch, num_few, cu_query_lens, context_lens, scheduled)
        n, few, rest = out
        # decode rows come first; the prefill part's offsets restart at 0 and cover the rest
        assert all(k <= 8 for _, k in scheduled[:num_few]) and all(k > 8 for _, k in scheduled[num_few:])
        assert few.cu_query_lens.tolist() == cu_query_lens[: num_few + 1]
        assert rest.cu_query_lens.tolist() == [c - n for c in cu_query_lens[num_few:]]
        assert n + rest.cu_query_lens[-1].item() == batch.slot_mapping.shape[0]
        splits.append(num_few)
        return out

    monkeypatch.setattr(ModelRunner, "_split_batch", spy)
    _, chunked = run(*setup, max_num_batched_tokens=20, enable_prefix_caching=False)
    assert splits, "no step mixed decodes with prefill chunks"
    assert chunked == one_by_one


def test_multi_turn_prefix_hit(setup):
    """A second turn whose prompt is the first turn's prompt and output and more: it reuses the
    first turn's cache (a hybrid: its KV blocks and its state snapshot at the first request's last
    block boundary) and decodes what an engine without prefix caching decodes."""
    path, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256)
    first = llm.generate({"prompt_token_ids": prompts[2]}, PARAMS, use_tqdm=False)[0]
    turn2 = prompts[2] + first.outputs[0].token_ids + list(range(3, 13))  # 70 + 24 + 10 tokens
    got = llm.generate({"prompt_token_ids": turn2}, WITH_LOGPROBS, use_tqdm=False)[0]
    fresh = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
                enable_prefix_caching=False)
    want = fresh.generate({"prompt_token_ids": turn2}, WITH_LOGPROBS, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert abs(got.outputs[0].cumulative_logprob - want.outputs[0].cumulative_logprob) < 1e-4
    assert got.num_cached_tokens == 80  # the first request's 94 known tokens fill 5 blocks
