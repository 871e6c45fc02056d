"""Speculative decoding through the engine: greedy output with speculation equals it without,
token for token, for each drafter, on dense and MoE tiny models, through chunked prefill,
preemption and prefix-cache hits; stops inside an accepted run; acceptance counts. Drafts are
verified every step here (adaptive: false; the choice of k has tests of its own,
test_spec_policy.py), so every case exercises verification."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import perturbed_copy

from hotpath import LLM, SamplingParams
from hotpath.speculative.config import SpeculativeConfig
from hotpath.speculative.ngram import ngram_propose

LENGTHS = [5, 33, 70, 16, 48, 91]
PARAMS = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def make_setup(name, tiny_model_factory, tmp_path_factory):
    """(target dir, a draft: the target with its weights perturbed, prompts). Prompts repeat a
    stretch of themselves, so n-gram lookups find something."""
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(11)
    vocab = hf_model.config.vocab_size
    prompts = []
    for n in LENGTHS:
        p = torch.randint(3, vocab, (n,), generator=g).tolist()
        prompts.append(p + p[: n // 2])
    draft = perturbed_copy(Path(path), tmp_path_factory.mktemp(f"draft-{name}"), g, 0.3)
    return str(path), str(draft), prompts


# every case on the dense model; the MoE model (slow on the CPU) through one case per drafter
@pytest.fixture(scope="module")
def setup(tiny_model_factory, tmp_path_factory):
    return make_setup("qwen2-gqa4-tied", tiny_model_factory, tmp_path_factory)


@pytest.fixture(scope="module")
def moe_setup(tiny_model_factory, tmp_path_factory):
    return make_setup("qwen3moe-e7-top3-sparse2", tiny_model_factory, tmp_path_factory)


def run(path, prompts, params=PARAMS, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", **{"max_model_len": 512, **kwargs})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, outs


@pytest.fixture(scope="module")
def plain(setup):
    path, _, prompts = setup
    return [o.outputs[0].token_ids for o in run(path, prompts)[1]]


def drafters(draft):
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                  "adaptive": False},
        "draft_model": {"method": "draft_model", "model": draft, "num_speculative_tokens": 4, "adaptive": False},
    }


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("case", ["together", "chunked", "preempted", "prefix_hits"])
def test_greedy_equals_plain(setup, plain, method, case):
    check_greedy_equals_plain(setup, plain, method, case)


@pytest.mark.parametrize("method, case", [("draft_model", "together"), ("ngram", "preempted")])
def test_moe_greedy_equals_plain(moe_setup, method, case):
    path, _, prompts = moe_setup
    check_greedy_equals_plain(moe_setup, [o.outputs[0].token_ids for o in run(path, prompts)[1]], method, case)


def check_greedy_equals_plain(setup, plain, method, case):
    path, draft, prompts = setup
    kwargs = {"speculative_config": drafters(draft)[method]}
    if case == "chunked":
        kwargs["max_num_batched_tokens"] = 20
    if case == "preempted":  # too few blocks for all six at once: the newest are preempted
        kwargs["num_gpu_blocks_override"] = 24
        kwargs["max_model_len"] = 256
        kwargs["enable_prefix_caching"] = False
    llm, outs = run(path, prompts, **kwargs)
    if case == "prefix_hits":
        hits = llm.engine.kv_cache.prefix_hit_tokens
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
        assert llm.engine.kv_cache.prefix_hit_tokens > hits
    if case == "preempted":
        assert llm.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == plain
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    drafted = sum(o.metrics["spec_num_draft_tokens"] for o in outs)
    accepted = sum(o.metrics["spec_num_accepted_tokens"] for o in outs)
    assert 0 < accepted <= drafted


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_async_scheduling_adaptive(setup, plain, method):
    """With async scheduling (the GPU default) and the adaptive choice of k: steps without
    drafts stay in flight while the next is scheduled, steps with drafts drain it first."""
    path, draft, prompts = setup
    spec = {**drafters(draft)[method], "adaptive": True}
    llm, outs = run(path, prompts, async_scheduling=True, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert llm.engine.spec_stats.num_draft_tokens > 0


@pytest.mark.parametrize("k", [5, 9])  # 9: verify rows longer than the decode kernel's 8 queries
def test_self_draft_accepts_everything(setup, plain, k):
    """The target drafting for itself: every draft is its own greedy token."""
    path, _, prompts = setup
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": k, "adaptive": False}
    llm, outs = run(path, prompts, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in outs] == plain
    stats = llm.engine.spec_stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert stats.accepted_per_pos == stats.drafted_per_pos


def test_stops_inside_an_accepted_run(setup, plain):
    """max_tokens and a stop token that fall inside a run of accepted drafts end the output
    there, as without speculation."""
    path, _, prompts = setup
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 5, "adaptive": False}
    for params in (SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=32, ignore_eos=True,
                                  stop_token_ids=[plain[2][9]])):
        want = [o.outputs[0].token_ids for o in run(path, prompts, params)[1]]
        got = [o.outputs[0].token_ids for o in run(path, prompts, params, speculative_config=spec)[1]]
        assert got == want


def test_logprobs_match_plain(setup):
    path, _, prompts = setup
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    want = run(path, prompts[:3], params)[1]
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3, "adaptive": False}
    got = run(path, prompts[:3], params, speculative_config=spec)[1]
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lw, lg in zip(w.outputs[0].logprobs, g.outputs[0].logprobs):
            assert lw.keys() == lg.keys()
            for t in lw:
                assert lg[t].logprob == pytest.approx(lw[t].logprob, abs=1e-4)
                assert lg[t].rank == lw[t].rank


def test_ngram_propose():
    ctx = [5, 6, 7, 8, 1, 2, 5, 6, 7, 9, 4, 5, 6, 7]
    # the longest suffix (5, 6, 7) last occurred at 6..8, followed by 9, 4, 5
    assert ngram_propose(ctx, 3, 1, 3) == [9, 4, 5]
    assert ngram_propose(ctx, 8, 1, 3) == [9, 4, 5, 6, 7]  # up to the end of the context
    assert ngram_propose([1, 2, 3], 3, 1, 3) == []
    assert ngram_propose([1, 2, 3, 4, 9, 3, 4], 2, 2, 2) == [9, 3]


@pytest.mark.parametrize("bad, message", [
    ({"num_speculative_tokens": 3}, "needs 'method'"),
    ({"method": "eagle", "num_speculative_tokens": 3}, "not one of"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 16}, r"\[1, 15\]"),
    ({"method": "draft_model", "num_speculative_tokens": 3}, "needs 'model'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup"),
    ({"method": "ngram", "num_speculative_tokens": 3, "typo": 1}, "unknown speculative config keys"),
    ("{not json", "not valid JSON"),
])
def test_bad_config(bad, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(bad)


def test_json_config():
    cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2}')
    assert cfg.method == "ngram" and cfg.num_speculative_tokens == 2



def test_draft_with_a_smaller_vocabulary(setup, plain, tmp_path):
    """A draft whose embedding table has fewer (padding) rows than the target's, as
    Qwen2.5-Coder-0.5B's 151,936 against the 32B's 152,064: its rows are padded, never proposed."""
    import json

    path, _, prompts = setup
    cfg = json.loads((Path(path) / "config.json").read_text())
    vocab = cfg["vocab_size"] - 12
    for f in Path(path).iterdir():
        if f.suffix == ".safetensors":
            tensors = {k: v[:vocab] if v.shape[0] == cfg["vocab_size"] else v for k, v in load_file(f).items()}
            save_file(tensors, tmp_path / f.name, metadata={"format": "pt"})
        elif f.name == "config.json":
            (tmp_path / f.name).write_text(json.dumps({**cfg, "vocab_size": vocab}))
        else:
            shutil.copy(f, tmp_path / f.name)
    spec = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3, "adaptive": False}
    llm, outs = run(path, prompts, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert llm.engine.spec_stats.num_accepted_tokens > 0


def test_ngram_drafter_keeps_each_context_incrementally(setup):
    """The n-gram drafter appends each step's new tokens to an array it keeps per sequence (no
    conversion of the whole context each step): the drafts are those of the lookup on the full
    token list, and a finished or aborted request's array is dropped."""
    path, _, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              speculative_config=drafters(None)["ngram"])
    drafter = llm.engine.speculation.drafter
    propose, checked = drafter.propose, []

    def checking(seqs, slots):
        propose(seqs, slots)
        for seq, k in zip(seqs, slots):
            assert seq.draft_token_ids == ngram_propose(seq.all_token_ids, k, drafter.min_n, drafter.max_n)
            checked.append(seq.seq_id)

    drafter.propose = checking
    llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    assert len(checked) > len(prompts) and not drafter.contexts
    llm.engine.add_request("aborted", {"prompt_token_ids": prompts[0]}, PARAMS)
    for _ in range(4):
        llm.engine.step()
    assert drafter.contexts
    llm.engine.abort_request("aborted")
    assert not drafter.contexts and not llm.engine.speculation.policy.acceptance


def test_at_most_so_many_sequences_draft_in_a_step(setup, plain, monkeypatch):
    """Past SPEC_GRAPH_MAX_ROWS decoding sequences (the speculative graphs' rows, the verify rows a
    hybrid keeps states for) the rest decode plainly in that step; outputs are unchanged."""
    from hotpath.engine import speculation as engine_module

    monkeypatch.setattr(engine_module, "SPEC_GRAPH_MAX_ROWS", 2)
    path, draft, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              speculative_config=drafters(draft)["draft_model"])
    propose, rows = llm.engine.speculation.drafter.propose, []
    llm.engine.speculation.drafter.propose = lambda seqs, slots: rows.append(len(seqs)) or propose(seqs, slots)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert rows and max(rows) == 2
