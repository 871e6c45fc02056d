"""The whole model on the GPU through the Triton ops (eager, and replayed in the runner's CUDA
graphs; hybrids too) gives the tokens the reference ops give (eager: the reference reads lengths on
the host, which a graph capture does not allow); and a hybrid's decode graphs give the tokens its
eager Triton steps give."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.ops import backend
from ops_cases import cuda


def greedy(path, prompts, ops_backend, enforce_eager):
    previous = backend.get_backend()
    backend.set_backend(ops_backend)
    try:
        llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype="float32",
                  max_model_len=512, enforce_eager=enforce_eager, num_gpu_blocks_override=256)
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        backend.set_backend(previous)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@cuda
@pytest.mark.parametrize("enforce_eager", [False, True])
@pytest.mark.parametrize("name", ["qwen3-gqa8-untied-hd", "llama-gqa4-tied-hd", "qwen3moe-e7-top3-sparse2",
                                  "qwen2moe-shared", "qwen3next-hybrid"])
def test_triton_ops_match_reference_ops(name, enforce_eager, tiny_model_factory):
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
               for n in (1, 9, 40, 130)]
    want = greedy(path, prompts, "reference", enforce_eager=True)
    got = greedy(path, prompts, "triton", enforce_eager)
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        for step, (a, b) in enumerate(zip(got_ids, want_ids)):
            lp_a, lp_b = got_lps[step][a].logprob, want_lps[step][b].logprob
            assert abs(lp_a - lp_b) < 1e-3, f"step {step}: logprob {lp_a} vs {lp_b}"
            if a != b:  # a near tie broke the other way: the sequences part here
                break


@cuda
@pytest.mark.parametrize("name", ["qwen3next-hybrid", "qwen3_5-dense"])
def test_hybrid_decode_graphs_match_eager(name, tiny_model_factory):
    """A hybrid's decode steps replayed as CUDA graphs (the linear-attention kernels reading each
    row's state slot from the graphs' static inputs, padding rows on the scratch slot) against the
    same Triton ops run eagerly. Prefix caching is on: the prompts come twice, the 17-token one
    then alone (its first step a single token after a restore), then a second turn restoring a
    snapshot a decode graph step saved (the runner copies snapshots around a graph's replay);
    async scheduling is on (the GPU default)."""
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
               for n in (1, 9, 17, 40, 130)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=0)

    def run(enforce_eager, turn2=None):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype="float32", max_model_len=512,
                  max_num_seqs=8, num_gpu_blocks_override=256, enforce_eager=enforce_eager)
        runner = llm.engine.executor.runner
        assert bool(runner.graphs) != enforce_eager
        replays = []
        if runner.graphs:
            run_graph = runner._run_decode_graph
            runner._run_decode_graph = lambda *a: replays.append(1) or run_graph(*a)
        outs = [llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
                for batch in (prompts, prompts, prompts[2:3])]  # the last: a one-token first step
        # 40 + 40 tokens: the hit reaches the last boundary the first turn's decode steps saved, 64
        turn2 = turn2 or prompts[3] + outs[0][3].outputs[0].token_ids + list(range(3, 13))
        outs.append(llm.generate({"prompt_token_ids": turn2}, params, use_tqdm=False))
        assert outs[-1][0].num_cached_tokens == 64
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for out in outs for o in out], turn2, len(replays)

    want, turn2, _ = run(enforce_eager=True)
    got, _, replays = run(enforce_eager=False, turn2=turn2)
    assert replays >= 4 * 39  # every decode step
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        for step, (a, b) in enumerate(zip(got_ids, want_ids)):
            lp_a, lp_b = got_lps[step][a].logprob, want_lps[step][b].logprob
            assert abs(lp_a - lp_b) < 1e-4, f"step {step}: logprob {lp_a} vs {lp_b}"
            if a != b:  # a near tie broke the other way (padded batches round differently)
                break
