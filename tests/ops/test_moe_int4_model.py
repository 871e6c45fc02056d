"""A Qwen3-MoE model with int4 experts end to end on the CPU: a tiny random checkpoint written in
AWQ's layout by hotpath's quantizer code (its round-to-nearest int4 and AWQ tensor format, every
projection and expert quantized: `hotpath quantize --method awq` leaves experts out) loads with
int4 experts (no dequantization at load) and generates the greedy tokens of the same model with
those experts dequantized, through the reference ops and through the Triton kernels under the
interpreter."""

from __future__ import annotations

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.layers.moe import FusedExperts
from hotpath.ops import backend
from hotpath.ops.quant.reference import dequantize_stored

GROUP = 128
# H = I = 128: the least the int4 kernels take (a 16-word run); 8 experts (the router is built as
# an int4 Linear before the loader resets it: its outputs a multiple of 8), 2 of them per token
CONFIG = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False, vocab_size=512,
              bos_token_id=1, eos_token_id=2, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def awq_checkpoint(tmp_path_factory):
    """(AWQ checkpoint dir, vocab size)."""
    import transformers
    from safetensors.torch import load_file, save_file

    from hotpath.quantizer import formats
    from hotpath.quantizer.int4_rtn import quantize_rtn
    from hotpath.quantizer.writer import write_config

    source = tmp_path_factory.mktemp("int4-moe-source")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("mlp.gate.weight"):  # decisive routing, not near-uniform
                p.mul_(50)
    model.save_pretrained(source)
    out = tmp_path_factory.mktemp("int4-moe-awq")
    tensors = {}
    for name, t in load_file(source / "model.safetensors").items():
        if name.endswith("_proj.weight"):  # attention and every expert's projections, not the router
            q, zeros, scales, _ = quantize_rtn(t.float(), GROUP)
            for suffix, packed in formats.awq_tensors(q, zeros, scales).items():
                tensors[f"{name.removesuffix('.weight')}.{suffix}"] = packed
        else:
            tensors[name] = t.to(torch.float16)
    save_file(tensors, out / "model.safetensors")
    write_config(source, out, formats.awq_config(GROUP, []), torch.float16)
    return out, CONFIG["vocab_size"]


def _llm(path) -> LLM:
    return LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=128,
               num_gpu_blocks_override=32)


def _experts(llm: LLM) -> list[FusedExperts]:
    return [m for m in llm.engine.executor.runner.model.modules() if isinstance(m, FusedExperts)]


def _dequantize_experts(llm: LLM) -> None:
    """Each FusedExperts' int4 experts replaced by their dequantized fp32 weights."""
    for m in _experts(llm):
        w13, w2 = ([dequantize_stored(w[e], s[e], z[e], GROUP) for e in range(m.num_experts)]
                   for w, s, z in ((m.w13, m.w13_scales, m.w13_zeros), (m.w2, m.w2_scales, m.w2_zeros)))
        m.checkpoint_quant = None  # the parameters made anew in the model dtype
        m.w13.data.copy_(torch.stack(w13))
        m.w2.data.copy_(torch.stack(w2))


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


def test_awq_experts_generate_as_dequantized(awq_checkpoint):
    """Reference ops: the int4 experts' model and its dequantized twin give the same greedy
    tokens (and logprobs)."""
    path, vocab = awq_checkpoint
    prompts = _prompts(vocab, (3, 9, 20, 33))
    int4 = _llm(path)
    experts = _experts(int4)
    assert experts and all(m.w13.dtype == torch.int32 and m.int4.group_size == GROUP for m in experts)
    assert experts[0].w13.shape == (8, 256, 16) and experts[0].w2_zeros.shape == (8, 128, 1)
    got = _greedy(int4, prompts, 12)
    dequantized = _llm(path)
    _dequantize_experts(dequantized)
    _assert_same(got, _greedy(dequantized, prompts, 12), 1e-5)


def test_awq_experts_through_the_kernels(awq_checkpoint, interpreter):
    """The Triton kernels (interpreter) on the int4 experts: the reference ops' tokens, at prompt
    lengths through the decode kernels (<= 16 tokens) and the grouped GEMM (20)."""
    path, vocab = awq_checkpoint
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
