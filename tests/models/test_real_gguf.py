"""The real models from GGUF give HF transformers' greedy output (HF loading the same GGUF), CPU fp32."""

import pytest
import torch

from hotpath import LLM, SamplingParams

pytestmark = pytest.mark.real_models

NUM_TOKENS = 32
# Real models in fp32: our kernels and HF's differ by ~1e-5 relative in the logits, so a genuine
# near tie is a top-two gap below 1e-3.
TIE = 1e-3
PROMPTS = [
    "Write a Python function that reverses a string.",
    "def fibonacci(n):",
    "The capital of France is",
]


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2-135m"])
def models(request, hf_gguf_models):
    llm = LLM(request.param, device="cpu", dtype="float32", max_model_len=512)
    yield llm, hf_gguf_models.get(request.param), request.param  # transformers loading the same GGUF
    hf_gguf_models.pop(request.param)  # the last test to use it


def test_greedy_matches_hf_generate(models):
    """HF's greedy output, as generate() would give it: HF's argmax after the prompt and each
    prefix of our tokens (one causal forward over prompt + ours gives every step's logits), equal
    to our token at every step up to the first difference, where HF's own top two logits must be
    a near tie (past it the sequences may part)."""
    llm, hf, _ = models
    tok = llm.get_tokenizer()
    chat = [llm.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])]
    prompts = chat + [tok.encode(p) for p in PROMPTS[1:]]
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        got = out.outputs[0].token_ids
        assert len(got) == NUM_TOKENS
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + got])).logits[0].float()
        steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(got)]  # the logits each token was chosen from
        ref = steps.argmax(-1).tolist()
        if got != ref:
            # allowed only where HF's own top two logits are a near tie at the first difference
            step = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
            top2 = torch.topk(steps[step], 2).values
            assert float(top2[0] - top2[1]) < TIE, f"diverged at step {step}: {got} vs HF {ref}"
        logprobs = torch.log_softmax(logits, -1)
        for step, (token, entry) in enumerate(zip(got, out.outputs[0].logprobs)):
            assert abs(entry[token].logprob - float(logprobs[len(prompt) + step - 1, token])) < 1e-3
    text = outs[0].outputs[0].text
    assert text.strip(), "the chat answer decodes to text"


def test_kept_quantized_equals_the_dequantized_copy(models):
    """The real file kept in its GGUF types (quantization="gguf", here through
    the torch reference): every quantized layer (Q5_0 / Q8_0 / Q4_K / Q6_K in the 0.5B model, Q4_1
    in SmolLM2; fused layers of two types; the untied LM head and embedding) dequantizes to the
    float32 copy's weights exactly, and the first token's logprob is the copy model's."""
    from hotpath.layers.linear import Linear
    from hotpath.layers.quant.gguf import GGUFLinearMethod
    from hotpath.ops.gguf import reference

    llm, _, name = models
    copy = llm.engine.executor.runner.model
    kept_llm = LLM(name, device="cpu", dtype="float32", max_model_len=512, quantization="gguf")
    kept = kept_llm.engine.executor.runner.model
    plain = dict(copy.named_modules())
    checked = 0
    for mod_name, module in kept.named_modules():
        method = getattr(module, "method", None)
        if not isinstance(method, GGUFLinearMethod):
            continue
        dense = torch.cat([reference.dequantize(run.weight) for run in method.runs])
        assert torch.equal(dense, plain[mod_name].weight), mod_name
        checked += 1
    assert checked >= sum(isinstance(m, Linear) for m in copy.modules())
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=1)  # the prompt's forward
    prompt = {"prompt_token_ids": llm.get_tokenizer().encode(PROMPTS[1])}
    want, got = (x.generate(prompt, params, use_tqdm=False)[0].outputs[0] for x in (llm, kept_llm))
    assert got.token_ids == want.token_ids
    for step, tok in enumerate(want.token_ids):
        assert abs(got.logprobs[step][tok].logprob - want.logprobs[step][tok].logprob) < 1e-4
