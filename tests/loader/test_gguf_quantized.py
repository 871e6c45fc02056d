"""A GGUF's linear layers kept in their GGUF types (quantization="gguf"):
the whole model on the CPU (the reference ops dequantize each weight as it runs) gives the tokens
and logprobs of the 16-bit copy's model, in float32, on a tiny Qwen2 GGUF that uses every type
(tests/tiny_gguf.py); and which runs the resolver gives which format."""

import pytest
import torch
from tiny_gguf import LAYER_TYPES, make_tiny_gguf_dir

from hotpath import LLM, SamplingParams
from hotpath.layers.linear import Linear, UnquantizedLinearMethod
from hotpath.layers.quant.gguf import GGUFLinearMethod, GGUFQuantConfig
from hotpath.resolve import _quant_config


@pytest.fixture
def gguf_dir(tmp_path, monkeypatch):
    return make_tiny_gguf_dir(tmp_path, monkeypatch)


def generate(model_dir, **kwargs):
    llm = LLM(str(model_dir), skip_tokenizer_init=True, device="cpu", dtype="float32",
              max_model_len=128, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in ([5, 17, 33, 90, 4], [7, 8])], params,
                        use_tqdm=False)
    return llm, [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs,
                                                                           o.outputs[0].token_ids)])
                 for o in outs]


def kept_matches_copy(model_dir):
    """The model kept quantized, after checking its greedy tokens and logprobs against the copy's."""
    _, want = generate(model_dir)
    llm, got = generate(model_dir, quantization="gguf")
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want):
        assert got_ids == want_ids
        assert max(abs(a - b) for a, b in zip(got_lps, want_lps)) < 1e-5
    return llm.engine.executor.runner.model


def test_kept_quantized_matches_the_16bit_copy(gguf_dir):
    model = kept_matches_copy(gguf_dir)
    methods = {name: m.method for name, m in model.named_modules() if isinstance(m, Linear)}
    assert len(methods) == 4 * len(LAYER_TYPES)
    assert all(isinstance(m, GGUFLinearMethod) for m in methods.values())
    # no 16-bit copy of a linear weight on the model; layer 0's qkv in two runs (Q5_0 q|k, Q8_0 v)
    assert all(m.weight.numel() == 0 for m in model.modules() if isinstance(m, Linear))
    qkv = methods["model.layers.0.self_attn.qkv_proj"]
    assert [(r.fmt.name, r.rows) for r in qkv.runs] == [("Q5_0", 256 + 128), ("Q8_0", 128)]
    assert [r.fmt.name for r in methods["model.layers.1.self_attn.qkv_proj"].runs] == ["Q4_0"]
    assert [r.fmt.name for r in model.lm_head.method.runs] == ["Q8_0"]  # the untied LM head too
    assert model.model.embed_tokens.method is not None  # and the untied embedding


def test_tied_lm_head_shares_the_quantized_embedding(tmp_path, monkeypatch):
    """A tied model's LM head runs the GGUF kernel on the embedding's own quantized matrix (one
    copy of it), with the 16-bit copy's tokens and logprobs."""
    model = kept_matches_copy(make_tiny_gguf_dir(tmp_path, monkeypatch, tied=True))
    head, embed = model.lm_head, model.model.embed_tokens
    assert head.method is embed.method and head.gguf0_codes is embed.gguf0_codes
    assert [r.fmt.name for r in head.method.runs] == ["Q5_0"]


def test_resolver_picks_the_format(gguf_dir, tiny_model_factory):
    assert _quant_config(gguf_dir, None) is None  # the dequantized copy, unless asked
    config = _quant_config(gguf_dir, "gguf")
    assert isinstance(config, GGUFQuantConfig)
    assert config.types["model.layers.0.mlp.down_proj.weight"] == 14  # Q6_K
    with pytest.raises(ValueError, match="does not apply to a GGUF"):
        _quant_config(gguf_dir, "awq")
    hf_dir, _ = tiny_model_factory("qwen2-gqa4-tied")
    with pytest.raises(ValueError, match="needs a GGUF model"):
        _quant_config(hf_dir, "gguf")


def test_float_projections_stay_unquantized(gguf_dir):
    """A layer with a projection the GGUF stores in float (or in a type without a kernel) loads
    dequantized as a whole."""
    config = GGUFQuantConfig.from_file(gguf_dir / "model.gguf")
    config.types["model.layers.0.self_attn.k_proj.weight"] = 0  # F32
    shards = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert isinstance(config.method_for("model.layers.0.self_attn.qkv_proj", shards),
                      UnquantizedLinearMethod)
    assert not any(config.keeps_quantized(f"{s}.weight") for s in shards)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kept_quantized_matches_the_16bit_copy(gguf_dir, tmp_path):
    """On a GPU, at every default but the dtype and quantization (CUDA graphs, the fused decode
    chain, the GGUF kernels; two prompts, then 40 at once: past the GEMV's 16 rows): in float32
    the tokens of the 16-bit copy's model (a plain HF directory of it); in bfloat16 (the kernels
    multiply exact codes, the copy rounds each weight) the first token's top logprob within
    bf16's rounding."""
    import gc

    from hotpath.loader.gguf import dequantized_copy

    g = torch.Generator().manual_seed(3)
    many = [torch.randint(0, 100, (int(n),), generator=g).tolist() for n in torch.randint(2, 20, (40,), generator=g)]
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        plain = dequantized_copy(gguf_dir, dtype, tmp_path / f"plain-{dtype}")
        runs = []
        for model_dir, quantization in ((gguf_dir, "gguf"), (plain, None)):
            llm = LLM(str(model_dir), skip_tokenizer_init=True, dtype=str(dtype).removeprefix("torch."),
                      quantization=quantization)
            params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
            runs.append([o.outputs[0] for batch in ([[5, 17, 33, 90, 4], [7, 8]], many)
                         for o in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)])
            del llm
            gc.collect()  # this engine's memory back before the next one sizes its KV cache
            torch.cuda.empty_cache()
        for got, want in zip(*runs):
            if dtype == torch.float32:
                assert got.token_ids == want.token_ids
            # the top logprob of the first step (the token itself may differ at a bf16 near tie)
            top = [o.logprobs[0][o.token_ids[0]].logprob for o in (got, want)]
            assert abs(top[0] - top[1]) < tol
