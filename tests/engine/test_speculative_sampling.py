"""Sampled output with speculation has the distribution of sampled output without it, through
the engine, on a tiny-vocabulary model: a chi-square test of homogeneity on each of the 2nd to
4th generated tokens (the 1st comes from the prefill, which speculation does not touch; the
first decode step verifies 3 drafts, so these are accepted drafts, corrections and bonus
tokens).

Power: 4,000 sequences a side, 16 tokens (15 degrees of freedom), alpha = 1e-3 (critical value
37.70; fixed seeds, so the test is deterministic). Two samples of n each whose distributions
differ by total variation d give a noncentrality lambda = (n / 2) * sum (p1 - p2)^2 / p_pooled
>= (n / 2) * (2 d)^2 = 2 n d^2 (Cauchy-Schwarz); 99% power at 15 degrees of freedom needs
lambda = 55.2 (scipy.stats.ncx2), so any d >= sqrt(55.2 / 8000) = 0.083 in either token's
distribution is caught with >= 99% probability. The negative control (temperature 0.8 against
1.0, a smaller change than most bugs make) must fail the same check, showing the test can fail.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from hotpath import LLM, SamplingParams

VOCAB = 16
N = 4000
SHARPEN = 6.0
CRITICAL = 37.70  # chi-square, 15 degrees of freedom, alpha = 1e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import make_tiny_model, perturbed_copy

    target = tmp_path_factory.mktemp("tiny-vocab")
    make_tiny_model("qwen2-gqa4-tied", target, vocab_size=VOCAB, seed=3)
    # a random model's next-token distributions are near uniform, where a wrong rule would go
    # unseen: the final norm's weight scaled up sharpens them (at the prompt: entropy 1.9 nats against 2.75 unscaled, ln 16 = 2.77)
    for f in target.glob("*.safetensors"):
        tensors = load_file(f)
        tensors["model.norm.weight"] = tensors["model.norm.weight"] * SHARPEN
        save_file(tensors, f, metadata={"format": "pt"})
    draft = perturbed_copy(target, tmp_path_factory.mktemp("tiny-vocab-draft"), torch.Generator().manual_seed(5), 0.5)
    return str(target), str(draft)


def tokens(path, temperature=1.0, seed0=0, **kwargs):
    """Tokens 2 to 4 of N sampled sequences of one prompt, each with its own seed."""
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=64,
              max_num_seqs=256, **kwargs)
    params = [SamplingParams(temperature=temperature, max_tokens=5, ignore_eos=True, seed=seed0 + i)
              for i in range(N)]
    outs = llm.generate([{"prompt_token_ids": [3, 7, 1, 9, 12, 3, 7]}] * N, params, use_tqdm=False)
    ids = torch.tensor([o.outputs[0].token_ids for o in outs])  # [N, 5]
    return [ids[:, i] for i in (1, 2, 3)], llm


def chi2(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-square statistic of homogeneity of two samples over the vocabulary (empty cells
    dropped)."""
    ca, cb = torch.bincount(a, minlength=VOCAB).double(), torch.bincount(b, minlength=VOCAB).double()
    total = ca + cb
    keep = total > 0
    ea, eb = total * ca.sum() / total.sum(), total * cb.sum() / total.sum()
    return float((((ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb)[keep]).sum())


@pytest.fixture(scope="module")
def plain(models):
    return tokens(models[0], seed0=10_000)[0]


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_sampled_distribution_unchanged(models, plain, method):
    target, draft = models
    spec = ({"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "adaptive": False}
            if method == "draft_model" else
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
             "adaptive": False})
    got, llm = tokens(target, speculative_config=spec)
    stats = llm.engine.spec_stats
    # drafts were checked, and some but not all accepted: both branches of the rule ran
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.drafted_per_pos[2] > 0  # runs of three drafts
    for a, b in zip(got, plain):
        assert chi2(a, b) < CRITICAL


def test_negative_control_fails(models, plain):
    got, _ = tokens(models[0], temperature=0.8)
    assert any(chi2(a, b) > CRITICAL for a, b in zip(got, plain))
