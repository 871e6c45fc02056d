"""Speculative decoding on the GPU (Triton kernels, CUDA graphs for the plain steps, async
scheduling at its default): greedy output with each drafter equals the output without
speculation on tiny dense and MoE models in fp32, where two paths' roundings differ far below
the models' logit gaps; and on a real-shaped engine (Qwen2.5-Coder-1.5B drafted by the 0.5B,
random weights in bf16) a run completes with the policy's measurements in place."""

import gc

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PARAMS = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.mark.parametrize("name", ["qwen2-gqa4-tied", "qwen3moe-e7-top3-sparse2"])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_equals_plain_on_gpu(tiny_model_factory, name, method, adaptive):
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(3)
    prompts = []
    for n in (5, 40, 90, 17):
        p = torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
        prompts.append(p + p[: n // 2])
    spec = ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
            if method == "ngram" else
            {"method": "draft_model", "model": str(path), "num_speculative_tokens": 4})

    def run(**kw):
        llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=512,
                  gpu_memory_utilization=0.3, **kw)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
        drafted = llm.engine.spec_stats.num_draft_tokens, len(llm.engine.executor.runner.row_graphs)
        del llm  # its memory back before the next engine sizes its cache
        gc.collect()
        torch.cuda.empty_cache()
        return [o.outputs[0].token_ids for o in outs], drafted

    want, _ = run()
    got, (drafted, captured) = run(speculative_config={**spec, "adaptive": adaptive})
    assert got == want
    assert drafted > 0 and captured > 0  # verify (and draft) steps ran as graphs


def test_real_shapes_complete():
    llm = LLM(str(preset_dir("qwen2.5-coder-1.5b")), load_format="dummy", skip_tokenizer_init=True,
              max_model_len=4096, gpu_memory_utilization=0.5,
              speculative_config={"method": "draft_model", "model": str(preset_dir("qwen2.5-coder-0.5b")),
                                  "num_speculative_tokens": 4})
    outs = llm.generate([{"prompt_token_ids": list(range(100, 612))}] * 2, PARAMS, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == PARAMS.max_tokens for o in outs)
    assert llm.engine.speculation.policy.step_time  # decode steps were timed


def test_mtp_greedy_equals_plain_on_gpu(tmp_path):
    """The multi-token-prediction head drafting on a hybrid tiny model (Qwen3-Next, its mtp.* head
    in the published layout): plain steps in decode graphs hand it their hidden states."""
    from tiny_models import make_tiny_model

    hf_model = make_tiny_model("qwen3next-hybrid", tmp_path, mtp_layers=1)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in (7, 60, 33)]

    def run(**kw):
        llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", max_model_len=512,
                  gpu_memory_utilization=0.3, **kw)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
        drafted = llm.engine.spec_stats.num_draft_tokens
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        return [o.outputs[0].token_ids for o in outs], drafted

    want, _ = run()
    got, drafted = run(speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert got == want and drafted > 0
