"""Tensor and expert parallelism through the whole engine on the CPU: worker processes joined in a
gloo group, driven by the multi-process executor with step plans. Greedy output at tp = 2 and 4
(and ep = 2, 4) equals the one-rank engine's token for token, with prefix caching, chunked
prefill, preemption and speculative decoding on (a draft model split with the target, n-gram
lookups), on the tiny dense, MoE (an expert count that the ranks do not divide, a shared expert),
hybrid (Gated DeltaNet, with its MTP head drafting), AWQ and fp8 block-scaled models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.quantizer.quantize import QuantizeOptions, quantize
from tiny_models import make_tiny_model

PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SHARED = list(range(40, 66))  # a prefix the prompts share: prefix-cache hits
PROMPTS = [SHARED + [7, 9, 11], SHARED + [3, 1], [5, 17, 33, 9, 100, 7] * 4, [200, 201, 300],
           SHARED + [7, 9, 11]]
# tight enough to chunk the prompts and to preempt sequences while they decode
SETTINGS = dict(skip_tokenizer_init=True, device="cpu", max_model_len=56, max_num_batched_tokens=24,
                num_gpu_blocks_override=14, block_size=4, max_num_seqs=4)


def generate(path: Path, **kwargs) -> tuple[list[list[int]], int]:
    llm = LLM(str(path), **SETTINGS, **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], llm.engine.scheduler.num_preemptions
    finally:
        llm.engine.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in ("qwen3-gqa8-untied-hd", "qwen2-gqa4-tied", "llama-mha-untied-llama3rope", "qwen3moe-e7-top3-sparse2",
                 "qwen2moe-shared", "qwen3next-hybrid"):
        out[name] = tmp_path_factory.mktemp(name)
        make_tiny_model(name, out[name], mtp_layers=1 if "hybrid" in name else 0)
    # AWQ groups of 16 (a rank's o_proj / down_proj inputs are 32 / 64 columns at tp 2)
    out["awq"] = quantize(str(out["llama-mha-untied-llama3rope"]), tmp_path_factory.mktemp("awq") / "q",
                          QuantizeOptions(method="awq", group_size=16, calibration="random", num_samples=2,
                                          seq_len=16, clip=False, scale_search=False))
    # fp8 block scales: a rank's k / v width (64 at tp 2) is not a multiple of the 128-row block
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    source = tmp_path_factory.mktemp("fp8-source")
    Qwen3ForCausalLM(Qwen3Config(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, vocab_size=512, tie_word_embeddings=False,
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)).save_pretrained(source)
    out["fp8-block"] = quantize(str(source), tmp_path_factory.mktemp("fp8") / "q", QuantizeOptions(method="fp8-block"))
    return out


CASES = [  # (model, engine settings besides SETTINGS, the ranks' settings)
    # one KV head, replicated on both ranks; the draft model (qwen2-gqa4-tied) split with the target
    ("qwen3-gqa8-untied-hd", dict(speculative_config={"method": "draft_model", "num_speculative_tokens": 3}),
     dict(tensor_parallel_size=2)),
    ("llama-mha-untied-llama3rope", dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
     dict(tensor_parallel_size=4)),
    ("qwen3moe-e7-top3-sparse2", {}, dict(tensor_parallel_size=2)),
    ("qwen3moe-e7-top3-sparse2", {}, dict(tensor_parallel_size=2, enable_expert_parallel=True)),  # 4 + 3 experts
    ("qwen2moe-shared", {}, dict(tensor_parallel_size=4, enable_expert_parallel=True)),
    ("qwen3next-hybrid", dict(speculative_config={"method": "mtp", "num_speculative_tokens": 2}),
     dict(tensor_parallel_size=2)),
    ("awq", {}, dict(tensor_parallel_size=2)),
    ("fp8-block", {}, dict(tensor_parallel_size=2)),
]


@pytest.mark.parametrize("name,settings,ranks", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_parallel_engine_matches_one_rank(models, name, settings, ranks):
    spec = settings.get("speculative_config")
    if spec is not None and spec["method"] == "draft_model":
        settings = dict(settings, speculative_config=dict(spec, model=str(models["qwen2-gqa4-tied"])))
    want, preempted = generate(models[name], **settings)
    assert preempted  # the cases exercise preemption (and chunking, prefix hits) at one rank too
    got, _ = generate(models[name], **settings, **ranks)
    assert got == want


def test_one_rank_in_its_own_process_matches_in_process(models):
    """distributed_executor_backend="mp" with one rank: the worker in a process of its own."""
    path = models["qwen3-gqa8-untied-hd"]
    assert generate(path, distributed_executor_backend="mp")[0] == generate(path)[0]
