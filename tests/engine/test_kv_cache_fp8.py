"""kv_cache_dtype="fp8": the engine end to end on the CPU (the torch reference ops) with K and V
stored as e4m3 in the paged cache, against the same model with its cache in fp32.

What it shows: the flag reaches the runner (an fp8 cache, half bf16's bytes a token, so twice
the blocks in the same memory), checkpoint scales are read under vLLM's names, and greedy decoding
stays close to the fp32-cache run. The kernels themselves are held to their references in
tests/ops/test_attention.py and test_rotary.py.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.config import EngineConfig
from hotpath.args import EngineArgs
from hotpath.layers.attention import Attention
from hotpath.models.registry import read_config
from hotpath.runner.model_runner import ModelRunner

MODEL = "qwen3-gqa8-untied-hd"  # QK-norm (keys of unit scale, as Qwen3's), 3 layers, 1 kv head


def _llm(path: Path, kv_cache_dtype: str) -> LLM:
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=256,
               kv_cache_dtype=kv_cache_dtype)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (4, 9, 16, 23, 31, 40)]


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int, logprobs: int | None = None):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def engines(tiny_model_factory) -> dict[str, LLM]:
    path, _ = tiny_model_factory(MODEL)
    return {kv: _llm(path, kv) for kv in ("auto", "fp8")}


def test_the_flag_reaches_the_cache(engines):
    runner = engines["fp8"].engine.executor.runner
    assert runner.kv_cache_dtype == torch.float8_e4m3fn
    assert engines["auto"].engine.executor.runner.kv_cache_dtype == torch.float32
    for layer in runner.kv_layers:
        assert all(c.dtype == torch.float8_e4m3fn for c in layer.caches())
        assert layer.cache_scales() == (1.0, 1.0)  # the checkpoint has none


# Measured (CPU, fp32 model, this tiny random Qwen3, k_scale = v_scale = 1): teacher-forced
# agreement 0.944 (68 of 72 positions), |logprob difference| of the fp32-cache run's token mean
# 0.0038, max 0.011; free-running (6 prompts x 16 tokens) 67 of 96 tokens before each run's first
# divergence. Random weights leave the top logits close (logprobs near log(1/512) = -6.2), so
# fp8's rounding flips a few; chance is 1/256. The bounds sit below.
def test_greedy_tokens_agree_with_the_fp32_cache(engines):
    prompts = _prompts()
    base = _greedy(engines["auto"], prompts, 12, logprobs=0)
    prefixes, expected, base_logprobs = [], [], []
    for prompt, out in zip(prompts, base):
        for i, token in enumerate(out.token_ids):
            prefixes.append(prompt + out.token_ids[:i])
            expected.append(token)
            base_logprobs.append(out.logprobs[i][token].logprob)
    got = _greedy(engines["fp8"], prefixes, 1, logprobs=5)
    agree = sum(o.token_ids[0] == t for o, t in zip(got, expected)) / len(expected)
    # the fp32-cache run's token as the fp8-cache run scores it (in its top 5)
    diffs = [abs(o.logprobs[0][t].logprob - lp) for o, t, lp in zip(got, expected, base_logprobs)
             if t in o.logprobs[0]]
    mean_diff, max_diff = sum(diffs) / len(diffs), max(diffs)
    free = [sum(1 for _ in iter_agreeing(a.token_ids, b.token_ids)) for a, b in
            zip(_greedy(engines["auto"], prompts, 16), _greedy(engines["fp8"], prompts, 16))]
    print(f"fp8 KV cache: teacher-forced agreement {agree:.3f} over {len(expected)} positions, "
          f"|logprob difference| mean {mean_diff:.4f} max {max_diff:.4f} ({len(diffs)} scored); "
          f"free-running tokens before divergence {free} of 16 each")
    assert agree >= 0.85
    assert len(diffs) >= 0.95 * len(expected)
    assert mean_diff < 0.01 and max_diff < 0.05
    assert sum(free) >= 0.5 * 16 * len(prompts)


def iter_agreeing(a: list[int], b: list[int]):
    """The common prefix of two token lists."""
    for x, y in zip(a, b):
        if x != y:
            return
        yield x


# MODEL's bf16 K and V for one 16-token block: 3 layers x 2 x 1 kv head x 32 x 2 bytes x 16
BF16_BLOCK_BYTES = 6144


def _runner(path: Path, dtype: torch.dtype, kv_cache_dtype: str) -> ModelRunner:
    """A runner whose KV budget is the binding limit: 100 bf16 blocks' worth of memory on the
    CPU (less than 256 sequences of 256 tokens would take)."""
    config = EngineConfig(max_model_len=256, cpu_kv_cache_gib=100 * BF16_BLOCK_BYTES / 2**30,
                          kv_cache_dtype=kv_cache_dtype)
    return ModelRunner(read_config(path), config, path, "dummy", torch.device("cpu"), dtype)


def test_fp8_doubles_the_blocks_that_fit(tiny_model_factory):
    """Same memory, half the bytes a token against bf16 (a quarter against fp32): twice the
    blocks (four times)."""
    path, _ = tiny_model_factory(MODEL)
    bf16, fp8 = _runner(path, torch.bfloat16, "auto"), _runner(path, torch.bfloat16, "fp8")
    assert bf16._cache_bytes_per_block() == BF16_BLOCK_BYTES == 2 * fp8._cache_bytes_per_block()
    assert (bf16.num_blocks, fp8.num_blocks) == (100, 200)
    assert fp8.kv_layers[0].caches()[0].shape[0] == fp8.num_blocks + 1  # + the scratch block
    assert _runner(path, torch.float32, "auto").num_blocks == 50


def _with_scales(src: Path, dst: Path, scales: dict[str, torch.Tensor]) -> Path:
    """src's checkpoint with extra tensors added."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    save_file({**weights, **scales}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_checkpoint_scales_are_read(tiny_model_factory, tmp_path):
    """vLLM's names on the attention block (layer 0), compressed-tensors' on its projections
    (layer 1); a layer without any keeps 1.0; the run with them still tracks the fp32 cache."""
    path, _ = tiny_model_factory(MODEL)
    scales = {"model.layers.0.self_attn.k_scale": torch.tensor(0.015625),
              "model.layers.0.self_attn.v_scale": torch.tensor([0.5]),
              "model.layers.1.self_attn.k_proj.output_scale": torch.tensor([0.25], dtype=torch.bfloat16),
              "model.layers.1.self_attn.v_proj.output_scale": torch.tensor(2.0)}
    llm = _llm(_with_scales(path, tmp_path / "scaled", scales), "fp8")
    layers = llm.engine.executor.runner.kv_layers
    assert [layer.cache_scales() for layer in layers] == [(0.015625, 0.5), (0.25, 2.0), (1.0, 1.0)]
    prompts = _prompts()[:3]
    got = _greedy(llm, prompts, 4)
    want = _greedy(_llm(path, "auto"), prompts, 4)
    assert sum(a.token_ids == b.token_ids for a, b in zip(got, want)) >= 2


def test_e4m3fnuz_caches_take_the_scales_doubled():
    """On gfx942 the same bits mean half as much: the cache's values equal e4m3fn's."""
    attn = Attention(2, 1, 8, 0.3)
    attn._load_scale("k", torch.tensor(0.25))
    attn.bind_cache(tuple(torch.empty(2, 4, 1, 8, dtype=torch.float8_e4m3fnuz) for _ in range(2)))
    assert attn.cache_scales() == (0.5, 2.0)


@pytest.mark.parametrize("tensor,message", [
    (torch.tensor([0.5, 0.5]), r"has shape \(2,\): the KV cache takes one scale per layer"),
    (torch.tensor(0.0), "is 0.0: a KV cache scale must be positive and finite"),
    (torch.tensor(float("nan")), "is nan: a KV cache scale must be positive and finite"),
])
def test_bad_checkpoint_scales_are_refused(tiny_model_factory, tmp_path, tensor, message):
    path, _ = tiny_model_factory(MODEL)
    bad = _with_scales(path, tmp_path / "bad", {"model.layers.2.self_attn.v_scale": tensor})
    with pytest.raises(ValueError, match=r"'model.layers.2.self_attn.v_scale' .*" + message):
        _llm(bad, "fp8")


def test_bad_kv_cache_dtype_is_refused(tiny_model_factory):
    path, _ = tiny_model_factory(MODEL)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, got 'int8'"):
        _llm(path, "int8")


def test_cli_flag():
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    assert EngineArgs.from_cli_args(parser.parse_args(["--kv-cache-dtype", "fp8"])).kv_cache_dtype == "fp8"
    assert EngineArgs.from_cli_args(parser.parse_args([])).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp16"])


# ---- on the GPU (skipped without CUDA): the Triton kernels, CUDA graphs, real memory sizing ----
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp8_kv_cache_engine():
    """Qwen3-0.6B's shapes (random weights, bf16) at under half the GPU: the fp8 cache gets
    twice the blocks of the bf16 one; greedy tokens track the bf16-cache run, teacher-forced
    (prefill kernels) and free-running (decode graphs with the fused fp8 cache write). Printed;
    random weights keep the top logits close, so the bounds are loose."""
    import gc

    from hotpath.bench.presets import preset_dir

    path = preset_dir("qwen3-0.6b")

    def engine(kv: str) -> LLM:
        return LLM(str(path), load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                   max_model_len=4096, gpu_memory_utilization=0.45, kv_cache_dtype=kv)

    prompts = [p * 8 for p in _prompts()]  # 32 to 320 tokens
    bf16 = engine("auto")
    blocks_bf16 = bf16.engine.executor.runner.num_blocks
    base = _greedy(bf16, prompts, 24)
    prefixes = [p + o.token_ids[:i] for p, o in zip(prompts, base) for i in range(0, 24, 3)]
    expected = [o.token_ids[i] for o in base for i in range(0, 24, 3)]
    del bf16
    gc.collect()
    torch.cuda.empty_cache()
    fp8 = engine("fp8")
    assert fp8.engine.executor.runner.kv_layers[0].caches()[0].dtype in (torch.float8_e4m3fn,
                                                                torch.float8_e4m3fnuz)
    ratio = fp8.engine.executor.runner.num_blocks / blocks_bf16
    free = [sum(1 for _ in iter_agreeing(a.token_ids, b.token_ids))
            for a, b in zip(base, _greedy(fp8, prompts, 24))]
    got = [o.token_ids[0] for o in _greedy(fp8, prefixes, 1)]
    agree = sum(a == b for a, b in zip(got, expected)) / len(expected)
    print(f"fp8 KV cache on {torch.cuda.get_device_name()}: {ratio:.3f}x the bf16 cache's blocks; "
          f"teacher-forced agreement {agree:.3f} over {len(expected)} positions; free-running "
          f"tokens before divergence {free} of 24 each")
    assert 1.95 < ratio < 2.05
    assert agree >= 0.5
    assert sum(free) >= 0.25 * 24 * len(prompts)
