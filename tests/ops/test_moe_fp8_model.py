"""A Qwen3-MoE model with fp8 experts end to end on the CPU: a tiny random checkpoint written in
Qwen's fp8 block layout by `hotpath quantize` loads with fp8 experts (no dequantization at load)
and generates the greedy tokens of the same model with those experts dequantized, through the
reference ops and through the Triton kernels under the interpreter."""

from __future__ import annotations

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.layers.moe import FusedExperts
from hotpath.ops import backend
from hotpath.ops.moe.reference import dequantize_experts

MODEL = "qwen3moe-e5-top2-norm"  # 5 experts of 48 rows: each projection one partial 128x128 block


@pytest.fixture(scope="module")
def fp8_checkpoint(tiny_model_factory, tmp_path_factory):
    from hotpath.quantizer.quantize import QuantizeOptions, quantize

    source, hf_model = tiny_model_factory(MODEL)
    out = quantize(str(source), tmp_path_factory.mktemp("fp8-block") / "out", QuantizeOptions(method="fp8-block"))
    return source, out, hf_model.config.vocab_size


def _llm(path) -> LLM:
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=128,
               num_gpu_blocks_override=32)


def _experts(llm: LLM) -> list[FusedExperts]:
    return [m for m in llm.engine.executor.runner.model.modules() if isinstance(m, FusedExperts)]


def _dequantize_experts(llm: LLM) -> None:
    """Each FusedExperts' fp8 experts replaced by their dequantized fp32 weights."""
    for m in _experts(llm):
        E = m.num_experts
        w13 = torch.stack([dequantize_experts(m.w13[e], m.w13_scale[e], m.fp8.block_size, 2) for e in range(E)])
        w2 = torch.stack([dequantize_experts(m.w2[e], m.w2_scale[e], m.fp8.block_size, 1) for e in range(E)])
        m.checkpoint_quant = None  # the parameters made anew in the model dtype
        m.w13.data.copy_(w13)
        m.w2.data.copy_(w2)


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def _prompts(vocab: int, lengths) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _assert_same(got, want, tol: float) -> None:
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        for step, tok in enumerate(got_ids):
            assert abs(got_lps[step][tok].logprob - want_lps[step][tok].logprob) < tol


def test_fp8_block_experts_generate_as_dequantized(fp8_checkpoint):
    """Reference ops: the fp8 experts' model and its dequantized twin give the same greedy
    tokens (and logprobs); the agreement with the unquantized source is printed."""
    source, path, vocab = fp8_checkpoint
    prompts = _prompts(vocab, (3, 9, 20, 33))
    fp8 = _llm(path)
    experts = _experts(fp8)
    assert experts and all(m.w13.dtype == torch.float8_e4m3fn and m.fp8.block_size == (128, 128)
                           for m in experts)
    assert experts[0].w13_scale.shape == (5, 2, 1) and experts[0].w2_scale.shape == (5, 1, 1)
    got = _greedy(fp8, prompts, 12)
    dequantized = _llm(path)
    _dequantize_experts(dequantized)
    _assert_same(got, _greedy(dequantized, prompts, 12), 1e-5)
    base = _greedy(_llm(source), prompts, 12)
    same = sum(a == b for (g, _), (w, _) in zip(got, base) for a, b in zip(g, w))
    print(f"greedy tokens as the unquantized model's: {same}/{12 * len(prompts)}")


def test_fp8_block_experts_through_the_kernels(fp8_checkpoint, interpreter):
    """The Triton kernels (interpreter) on the fp8 experts: the reference ops' tokens, at prompt
    lengths through the decode kernels (<= 16 tokens) and the grouped GEMM (20)."""
    _, path, vocab = fp8_checkpoint
    prompts = _prompts(vocab, (1, 7, 20))
    previous = backend.get_backend()
    try:
        backend.set_backend("reference")
        want = _greedy(_llm(path), prompts, 4)
        backend.set_backend("triton")
        got = _greedy(_llm(path), prompts, 4)
    finally:
        backend.set_backend(previous)
    _assert_same(got, want, 1e-4)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_quantize_int4_refuses_moe_experts(method, tiny_model_factory, tmp_path):
    """hotpath quantize writes MoE models in fp8 only: int4 says so, naming the way out."""
    from hotpath.quantizer.quantize import QuantizeOptions, quantize

    source, _ = tiny_model_factory(MODEL)
    with pytest.raises(ValueError, match="does not quantize MoE experts.*fp8-block"):
        quantize(str(source), tmp_path / "out", QuantizeOptions(method=method, group_size=16))
