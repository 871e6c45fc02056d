"""Speculative decoding with the checkpoint's multi-token-prediction head (method "mtp";
speculative/model_drafters.MtpDrafter, models/mtp.py) on Qwen3-Next's and Qwen3.5's tiny models with an
`mtp.*` head in the published layout: greedy output equals it without speculation, token for
token, together, through chunked prefill, preemption and prefix-cache hits; the head's drafts after
catching up step by step (prefill chunks, decodes, verify rows' kept tokens) are the head's guess
after the context, applied from scratch by transformers' own layers; a checkpoint without a head is
a clear error."""

import os
from pathlib import Path

import pytest
import torch
from test_speculative_hybrid import sharpened
from eager_graphs import capture_eager_graphs
from mtp_reference import hf_reference, mtp_tensors
from tiny_models import make_tiny_model

from hotpath import LLM, SamplingParams

if not torch.cuda.is_available():  # before any kernel module is imported (see tests/ops/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

LENGTHS = [5, 33, 70, 48]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def make_setup(name, tmp_path_factory):
    raw = tmp_path_factory.mktemp(f"mtp-{name}")
    hf_model = make_tiny_model(name, raw, mtp_layers=1)
    g = torch.Generator().manual_seed(11)
    path = sharpened(raw, tmp_path_factory.mktemp(f"mtp-sharp-{name}"), g)
    vocab = hf_model.config.vocab_size
    prompts = []
    for n in LENGTHS:
        p = torch.randint(3, vocab, (n,), generator=g).tolist()
        prompts.append(p + p[: n // 2])
    return str(path), prompts


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return make_setup("qwen3next-hybrid", tmp_path_factory)


def run(path, prompts, params=PARAMS, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", **{"max_model_len": 512, **kwargs})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


MTP = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
PLAIN: dict = {}  # (checkpoint, engine settings) -> outputs without speculation


@pytest.mark.parametrize("case", ["together", "chunked", "preempted", "prefix_hits"])
def test_greedy_equals_plain(setup, case):
    path, prompts = setup
    kwargs = {"together": {}, "chunked": {"max_num_batched_tokens": 40},
              # too few blocks for all four at once: the newest are preempted
              "preempted": {"num_gpu_blocks_override": 18, "max_model_len": 256, "enable_prefix_caching": False},
              "prefix_hits": {}}[case]
    key = (path, tuple(sorted(kwargs.items())))
    if key not in PLAIN:  # the cases with the same engine settings share the plain run
        PLAIN[key] = run(path, prompts, **kwargs)[1]
    want = PLAIN[key]
    llm, got = run(path, prompts, speculative_config=MTP, **kwargs)
    assert got == want
    if case == "prefix_hits":  # the same prompts again: their prefixes are cached now
        got = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)]
        assert got == want
    if case == "preempted":
        assert llm.engine.scheduler.num_preemptions > 0
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens >= 0


def test_decode_graphs_leave_the_hidden_states(setup):
    """Plain decode steps in graphs (k = 0 steps, here through the CPU's stand-in for a capture)
    hand the head their final hidden states through the graphs' buffer: the same outputs and the
    same drafts as the eager steps."""
    path, prompts = setup
    eager = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
                speculative_config=MTP)
    want = drafts_proposed(eager, prompts[:3], PARAMS)
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              speculative_config=MTP, max_num_seqs=4)
    capture_eager_graphs(llm)
    replays = []

    def recorded(replay, size):
        def run():
            replays.append(size)
            replay()
        return run

    for size, (graph, _) in llm.engine.executor.runner.graphs.items():
        graph.replay = recorded(graph.replay, size)
    # every other step plain (as the adaptive policy's k = 0), so decodes run in the graphs
    choose = llm.engine.speculation.policy.choose
    turn = iter(range(10**6))
    llm.engine.speculation.policy.choose = lambda seqs, prefilling=False, behind=0: 0 if next(turn) % 2 else choose(seqs, prefilling)
    got = drafts_proposed(llm, prompts[:3], PARAMS)
    assert replays
    # after a plain step the head caught up on it: the drafts at the contexts both runs drafted at
    seen = dict(want)
    common = [(c, d) for c, d in got if c in seen]
    assert common and all(seen[c] == d for c, d in common)


def test_qwen3_5_greedy_equals_plain(tmp_path_factory):
    path, prompts = make_setup("qwen3_5-dense", tmp_path_factory)
    _, want = run(path, prompts)
    llm, got = run(path, prompts, speculative_config=MTP)
    assert got == want and llm.engine.spec_stats.num_draft_tokens > 0


def drafts_proposed(llm, prompts, params):
    """(context, drafts) of every step the engine drafted in."""
    log = []
    propose = llm.engine.executor.worker.drafter.propose

    def logged(seqs, slots):
        propose(seqs, slots)
        log.extend((tuple(seq.all_token_ids), list(seq.draft_token_ids)) for seq in seqs if seq.draft_token_ids)

    llm.engine.executor.worker.drafter.propose = logged
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return log


def test_drafts_are_the_heads_guess_after_the_context(setup):
    """The first draft the engine proposes at a context x_0..x_{n-1} (after catching up step by
    step: a prefill, decodes, verify rows keeping some of their tokens) is the argmax of the head
    applied from scratch, by transformers' own layers (tests/mtp_reference.py), to rows t = 0..n-2:
    the token x_{t+1} and the target's final hidden state h_t (HF's model on the whole context);
    the second, of one row more at position n - 1: the first draft and the head's own output."""
    import transformers

    path, prompts = setup
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              speculative_config=MTP)
    steps = drafts_proposed(llm, prompts[:2], PARAMS)
    assert len(steps) > 6
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    tensors = mtp_tensors(Path(path))
    for context, drafts in steps[1::3][:4]:  # later contexts: after decodes and verify rows
        ids = torch.tensor(context)
        with torch.no_grad():
            hidden = hf.model(ids[None]).last_hidden_state[0]  # [n, H], after the final norm
            out = hf_reference(hf, tensors, ids[1:], hidden[:-1])  # rows 0..n-2
            assert drafts[0] == int(hf.lm_head(out[-1]).argmax()), (len(context), drafts)
            out = hf_reference(hf, tensors, torch.cat([ids[1:], torch.tensor(drafts[:1])]),
                               torch.cat([hidden[:-1], out[-1:]]))
            assert drafts[1] == int(hf.lm_head(out[-1]).argmax()), (len(context), drafts)


def test_sampled_drafts_are_verified_with_their_distribution(setup):
    """Sampling requests draft from the head's processed distribution (kept for the rejection
    sampler): per-request seeds give the same outputs run to run, and tokens are drafted."""
    path, prompts = setup
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, ignore_eos=True, seed=7)
    runs = [run(path, prompts[:2], params, speculative_config=MTP) for _ in range(2)]
    assert runs[0][1] == runs[1][1]
    assert runs[0][0].engine.spec_stats.num_draft_tokens > 0


def test_checkpoint_without_a_head(tiny_model_factory):
    path, _ = tiny_model_factory("qwen3next-hybrid")
    with pytest.raises(ValueError, match="no multi-token-prediction head"):
        LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=128, speculative_config=MTP)
    dense, _ = tiny_model_factory("qwen2-gqa4-tied")
    with pytest.raises(ValueError, match="has no multi-token-prediction head"):
        LLM(str(dense), skip_tokenizer_init=True, device="cpu", max_model_len=128, speculative_config=MTP)
