"""Greedy tokens and logprobs against HF transformers on tiny random checkpoints (CPU, fp32)."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from tiny_models import TINY_CONFIGS

NUM_TOKENS = 12
TIE = 1e-5  # HF top-two logits closer than this: either token is a correct greedy choice


def random_prompts(vocab: int, lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def check_against_hf(hf_model, prompt: list[int], out_ids: list[int], out_logprobs: list[dict]) -> None:
    ids = torch.tensor([prompt + out_ids])
    with torch.no_grad():
        logits = hf_model(ids).logits[0].float()  # [len, vocab]
    logprobs = torch.log_softmax(logits, dim=-1)
    for step, token in enumerate(out_ids):
        row = logits[len(prompt) + step - 1]
        top2 = torch.topk(row, 2)
        best = int(top2.indices[0])
        near_tie = float(top2.values[0] - top2.values[1]) < TIE
        assert token == best or near_tie, f"step {step}: hotpath {token}, HF argmax {best}"
        ref_lp = float(logprobs[len(prompt) + step - 1, token])
        got_lp = out_logprobs[step][token].logprob
        assert abs(got_lp - ref_lp) < 1e-4, f"step {step}: logprob {got_lp} vs HF {ref_lp}"
        if token != best:  # a near tie went the other way: the sequences diverge from here
            return


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_greedy_matches_hf(name, tiny_model_factory):
    path, hf_model = tiny_model_factory(name)
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512)
    prompts = random_prompts(hf_model.config.get_text_config().vocab_size, [1, 7, 16, 17, 45])
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        assert out.prompt_token_ids == prompt
        completion = out.outputs[0]
        assert len(completion.token_ids) == NUM_TOKENS
        assert completion.finish_reason == "length"
        check_against_hf(hf_model, prompt, completion.token_ids, completion.logprobs)


def test_rope_tables_match_hf():
    """inv_freq for every supported rope_type equals transformers' own computation."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hotpath.models.registry import config_from_hf
    from hotpath.layers.rotary import rope_inv_freq

    cases = [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 1024},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    ]
    for scaling in cases:
        hf_cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=8192,
                             rope_scaling=scaling, rope_theta=500000.0)
        cfg = config_from_hf(hf_cfg.to_dict())
        ours, scale = rope_inv_freq(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        rope_type = cfg.rope["rope_type"]
        if rope_type == "default":
            ref = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
            ref_scale = 1.0
        else:
            ref, ref_scale = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, "cpu")
        torch.testing.assert_close(ours, ref, rtol=0, atol=0, msg=rope_type)
        assert scale == pytest.approx(ref_scale), rope_type
