"""The engine as a user builds it, on the GPU: `LLM(model, load_format="dummy", dtype="bfloat16",
skip_tokenizer_init=True)` at the published Qwen3 shapes, every other setting at its default
(max_model_len the config's 40,960, gpu_memory_utilization 0.9, max_num_seqs 256, prefix caching,
CUDA graphs, async scheduling). The benchmarks and the other GPU tests size their engines to the
job; a default engine once crashed capturing its decode graphs while every one of those passed.

Each test builds its engine, generates, then drops it (del, gc.collect, empty_cache) and checks
that the GPU memory came back, so that engines built one after another in one process each find
the GPU as the first did. They take 90% of the GPU each: run them without pytest-xdist (they skip
under more than one worker)."""

import gc
import math
import os
from dataclasses import dataclass

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir
from hotpath.outputs import RequestOutput

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1,
                       reason="each engine takes 90% of the GPU: run without pytest-xdist"),
]

PRESETS = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"]
PROMPT_LEN = 512
OUTPUT_LEN = 64
MAX_MODEL_LEN = 40960  # the presets' max_position_embeddings, so the default
BLOCK_SIZE = 16
MiB = 2**20

# preset -> KV cache blocks its first engine got; a later engine of the preset must get as many,
# which it does only if the engines before it gave their memory back
kv_blocks: dict[str, int] = {}


@dataclass(frozen=True)
class Memory:
    free: int  # the driver's free bytes on the device
    allocated: int  # bytes in live tensors (torch's caching allocator)
    reserved: int  # bytes the caching allocator holds from the driver


def memory() -> Memory:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return Memory(torch.cuda.mem_get_info()[0], torch.cuda.memory_allocated(), torch.cuda.memory_reserved())


def live_cuda_objects() -> str:
    """What still holds GPU memory, for a failure message: the largest live CUDA tensors, and the
    CUDA graphs alive (each holds its memory pool)."""
    tensors, graphs = [], 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                tensors.append((obj.untyped_storage().nbytes() // MiB, tuple(obj.shape), str(obj.dtype)))
            elif isinstance(obj, torch.cuda.CUDAGraph):
                graphs += 1
        except Exception:  # half torn-down or lazy objects are not what is looked for
            continue
    tensors.sort(reverse=True)
    return f"{len(tensors)} CUDA tensors alive (MiB, shape, dtype), largest: {tensors[:12]}; {graphs} CUDA graphs"


def assert_given_back(before: Memory, after: Memory) -> None:
    """After an engine is dropped: its tensors freed, its KV cache and graph pools back with the
    driver. The margins hold what a first engine leaves for good (cuBLAS workspaces, the CUDA
    context's kernel modules); a KV cache or a graph pool is gigabytes."""
    numbers = f"before {before}, after {after}"
    assert after.allocated - before.allocated < 256 * MiB, f"{numbers}; {live_cuda_objects()}"
    assert after.reserved - before.reserved < 512 * MiB, f"{numbers}; {live_cuda_objects()}"
    assert before.free - after.free < 1024 * MiB, f"{numbers}; {live_cuda_objects()}"


def build(preset: str) -> LLM:
    """The engine a user gets for this model: nothing but what random weights need."""
    return LLM(model=str(preset_dir(preset)), load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)


def check_defaults(llm: LLM, preset: str) -> None:
    engine = llm.engine
    # the settings under test are the defaults (a change of default must change this test too)
    assert engine.config.max_model_len == MAX_MODEL_LEN
    assert engine.config.enable_prefix_caching and engine.config.max_num_seqs == 256
    assert engine.config.num_gpu_blocks_override is None and engine.config.gpu_memory_utilization == 0.9
    assert engine.async_scheduling and max(engine.executor.runner.graphs) == 256
    kv_blocks.setdefault(preset, engine.executor.runner.num_blocks)
    assert engine.executor.runner.num_blocks >= 0.99 * kv_blocks[preset], (
        f"{engine.executor.runner.num_blocks} KV blocks, the first {preset} engine had {kv_blocks[preset]}")


def random_prompts(llm: LLM, lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    vocab = llm.engine.model_config.vocab_size
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
    """Generates; checks each sequence got max_tokens tokens in the vocabulary with finite
    logprobs (random weights: nothing more can be said of them)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    vocab = llm.engine.model_config.vocab_size
    for out in outs:
        assert len(out.outputs) == params.n
        for c in out.outputs:
            assert len(c.token_ids) == params.max_tokens and c.finish_reason == "length", c
            assert all(0 <= t < vocab for t in c.token_ids), c.token_ids
            lps = [entry[t].logprob for t, entry in zip(c.token_ids, c.logprobs)]
            assert all(math.isfinite(lp) and lp <= 1e-4 for lp in lps), lps
    return outs


@pytest.mark.parametrize("preset", PRESETS)
def test_default_engine(preset):
    """Greedy from 512-token prompts at batch 1 (a short-context decode graph) and 8 (one prompt a
    prefix-cache hit), then seeded sampling with n = 2 (the Sampler on the graphs' logits)."""
    before = memory()
    llm = build(preset)
    try:
        check_defaults(llm, preset)
        # logprobs=0: the sampled token's logprob only, which keeps greedy rows on the graphs' argmax
        greedy = SamplingParams(temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True, logprobs=0)
        prompts = random_prompts(llm, [PROMPT_LEN] * 8, seed=0)
        generate(llm, prompts[:1], greedy)
        outs = generate(llm, prompts, greedy)
        assert outs[0].num_cached_tokens == (PROMPT_LEN - 1) // BLOCK_SIZE * BLOCK_SIZE
        sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=1, n=2, max_tokens=OUTPUT_LEN,
                                 ignore_eos=True, logprobs=1)
        generate(llm, prompts[4:], sampled)
    finally:
        del llm  # also when a check failed: the traceback must not keep the engine for the next test
    assert_given_back(before, memory())


def test_longest_context():
    """Qwen3-0.6B at max_model_len: a prompt of 40,952 tokens (prefilled in chunks) decoded to
    40,960 in the full-length decode graph; then that prompt again (a prefix-cache hit of 40,944
    tokens) beside a new one, two rows at the longest context."""
    before = memory()
    llm = build("qwen3-0.6b")
    try:
        check_defaults(llm, "qwen3-0.6b")
        n = MAX_MODEL_LEN - 8
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
        first, second = random_prompts(llm, [n, n], seed=1)
        generate(llm, [first], params)
        outs = generate(llm, [first, second], params)
        assert outs[0].num_cached_tokens == (n - 1) // BLOCK_SIZE * BLOCK_SIZE
    finally:
        del llm
    assert_given_back(before, memory())
