"""The soak workload (tests/soak.py) on a GPU through the public API: a few hundred requests
(HOTPATH_SOAK_REQUESTS=3000 for the full run) of 1 to 30,000 prompt tokens on a tiny fp32 Qwen3,
with a KV cache small enough to preempt, run on the default path (Triton kernels, CUDA graphs,
async scheduling) and on the reference ops, then compared: greedy tokens identical up to near ties,
seeded sampled ones counted where they part. Prints the counts as one JSON line (and writes it to
$HOTPATH_SOAK_OUT if set)."""

import gc
import os

import pytest
import torch

from hotpath import LLM
from hotpath.ops import backend
from soak import TOP_LOGPROBS, compare, make_soak_model, make_workload, report, run_soak

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NUM_REQUESTS = int(os.environ.get("HOTPATH_SOAK_REQUESTS", "300"))
MAX_PROMPT_LEN = 30_000
MAX_OUTPUT_LEN = 128
MAX_POSITIONS = 32_768  # the engine's max_model_len: its default, the model's own
# 36,864 tokens: the longest request fits (the engine asks that max_model_len does), and a burst
# with two long prompts does not
NUM_BLOCKS = 2304


def run(model_dir, requests, ops: str, top_logprobs: int | None):
    previous = backend.get_backend()
    backend.set_backend(ops)
    try:
        llm = LLM(str(model_dir), dtype="float32", num_gpu_blocks_override=NUM_BLOCKS)
        result = run_soak(llm, requests, top_logprobs)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        return result
    finally:
        backend.set_backend(previous)


def test_soak_triton_against_reference(tmp_path):
    model_dir, vocab_size = make_soak_model(tmp_path, MAX_POSITIONS)
    requests = make_workload(NUM_REQUESTS, vocab_size, MAX_PROMPT_LEN, MAX_OUTPUT_LEN, seed=0)
    triton = run(model_dir, requests, "auto", None)  # the default: Triton on the GPU
    reference = run(model_dir, requests, "reference", TOP_LOGPROBS)
    diff = compare(triton, reference, requests)
    report({"device": torch.cuda.get_device_name(), "triton": triton.counts,
            "reference": reference.counts, **diff})
    for counts in (triton.counts, reference.counts):
        assert counts["preemptions"] > 0 and counts["aborts"] > 0 and counts["prefix_cache_hit_tokens"] > 0
    # a seeded draw parts only where the two paths' probabilities straddle it to the last bits:
    # rare, while seeds not honoured on one path would part nearly every sequence
    assert diff["sampled_divergences"] <= max(2, diff["compared_sampled"] // 20), diff
