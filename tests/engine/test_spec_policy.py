"""The choice of each step's number of drafts (speculative/policy.py): from measured acceptance
and measured step times, k = 0 where speculation does not pay, with periodic re-measurement."""

import pytest

from hotpath import LLM, SamplingParams
from hotpath.engine.sequence import Sequence
from hotpath.speculative.policy import EXPLORE_BUDGET, EXPLORE_EVERY, DraftLengthPolicy

K = 4


def seqs(n: int) -> list[Sequence]:
    return [Sequence(seq_id=i, request_id="r", index=0, prompt_token_ids=[1, 2], params=SamplingParams(temperature=0), max_tokens=16, stop_token_ids=set()) for i in range(n)]


def timed(policy: DraftLengthPolicy, batch_size: int, k: int, seconds: float) -> None:
    """Steps of one kind: the first (a warm-up) is dropped, the second kept."""
    policy.record_step(batch_size, k, 10 * seconds)
    policy.record_step(batch_size, k, seconds)


def measured(step_time: dict[int, float], acceptance: float, batch: list[Sequence]) -> DraftLengthPolicy:
    policy = DraftLengthPolicy(K)
    for k, t in step_time.items():
        timed(policy, len(batch), k, t)
    for s in batch:
        for _ in range(20):
            accepted = K if acceptance == 1 else 0
            policy.record_acceptance(s, K, accepted)
    return policy


def test_explores_both_ends_first():
    batch = seqs(3)
    policy = DraftLengthPolicy(K)
    assert policy.choose(batch) == K  # nothing measured: speculate, and time it
    policy.record_step(3, K, 5.0)  # the first step of a kind warms up: not kept
    assert policy.choose(batch) == K and not policy.step_time
    policy.record_step(3, K, 0.02)
    assert policy.choose(batch) == 0  # then a plain step, to compare
    timed(policy, 3, 0, 0.01)
    assert policy.step_time == {(4, K): 0.02, (4, 0): 0.01}
    assert policy.choose(batch) in range(K + 1)


def test_explores_only_in_pure_decode_steps():
    """Steps with prompts prefilling beside the decodes are not timed: speculation is not tried
    at a batch size until a pure decode step can measure it."""
    batch = seqs(3)
    policy = DraftLengthPolicy(K)
    assert policy.choose(batch, prefilling=True) == 0
    assert policy.choose(batch) == K
    timed(policy, 3, K, 0.02)
    timed(policy, 3, 0, 0.01)
    assert policy.choose(batch, prefilling=True) == policy.choose(batch)  # measured: the same choice


def test_speculates_where_drafts_are_accepted_and_verify_is_cheap():
    batch = seqs(4)
    policy = measured({0: 0.010, K: 0.012}, acceptance=1, batch=batch)
    assert policy.choose(batch) == K


def test_off_where_drafts_are_rejected_then_measures_again():
    """While speculation does not pay, it is re-measured after EXPLORE_EVERY steps, then after
    twice as many, and so on (each re-measurement costs a verify step); once it pays again the
    interval starts over."""
    batch = seqs(4)
    policy = measured({0: 0.010, K: 0.016}, acceptance=0, batch=batch)
    n = EXPLORE_EVERY
    choices = [policy.choose(batch) for _ in range(7 * n)]
    assert [i for i, k in enumerate(choices) if k] == [n - 1, 3 * n - 1, 7 * n - 1]
    assert set(choices) == {0, K}
    for s in batch:  # the drafts come to be accepted: speculation pays, the interval resets
        for _ in range(20):
            policy.record_acceptance(s, K, K)
    assert policy.choose(batch) == K
    for s in batch:
        for _ in range(40):
            policy.record_acceptance(s, K, 0)
    choices = [policy.choose(batch) for _ in range(n)]
    assert choices.count(K) == 1 and choices[-1] == K


def test_a_costly_exploration_waits_longer():
    """A re-measurement whose step cost much more than a plain one (a draft model catching up on
    the tokens of the plain steps) puts the next one off until that cost is EXPLORE_BUDGET of
    the plain steps' time in between."""
    batch = seqs(4)
    policy = measured({0: 0.010, K: 0.016}, acceptance=0, batch=batch)
    choices = [policy.choose(batch) for _ in range(EXPLORE_EVERY)]
    assert choices[-1] == K and policy.exploring == 4
    policy.record_exploration(0.010 + 0.2)  # 0.2 s beyond a plain step
    assert policy.exploring is None
    wait = round(0.2 / (EXPLORE_BUDGET * 0.010))
    choices = [policy.choose(batch) for _ in range(wait)]
    assert choices.count(K) == 1 and choices[-1] == K
    policy.record_exploration(0.016)  # cheap this time: the interval stays (doubling stops at 800)
    assert policy.explore_every[4] == wait


def test_a_long_catch_up_is_predicted():
    """A draft model far behind (it skipped the plain steps, and maybe a prompt) re-measures only
    once the tokens it would catch up on, at its measured cost a token, are EXPLORE_BUDGET of the
    plain steps' time since speculation last ran."""
    batch = seqs(4)
    policy = measured({0: 0.010, K: 0.016}, acceptance=0, batch=batch)
    policy.record_catch_up(1000, 0.1)  # 0.1 ms a token
    behind = 2000  # 0.2 s to catch up: 2,000 plain steps' time at 1%
    choices = [policy.choose(batch, behind=behind) for _ in range(4500)]
    assert [i for i, k in enumerate(choices) if k] == [1999, 3999]
    assert policy.choose(batch, behind=0) == K  # 500 steps since: past the interval (100)


def test_no_exploration_while_prompts_prefill():
    """A re-measurement due while prompts prefill beside the decodes waits for a pure decode
    step (the step's time would count the prefill)."""
    batch = seqs(4)
    policy = measured({0: 0.010, K: 0.016}, acceptance=0, batch=batch)
    assert K not in [policy.choose(batch, prefilling=True) for _ in range(3 * EXPLORE_EVERY)]
    assert policy.choose(batch) == K


def test_sequences_without_promise_are_not_explored():
    """Where each sequence's drafts have missed (an n-gram drafter finding no match counts as a
    miss), not even free drafts would pay: k = 0 before the verify step was ever timed, and
    speculation is tried again only after EXPLORE_EVERY steps; a new sequence starts from what
    the others measured."""
    batch = seqs(2)
    policy = DraftLengthPolicy(K)
    for s in batch:
        for _ in range(12):
            policy.record_acceptance(s, K, 0)
    choices = [policy.choose(batch) for _ in range(EXPLORE_EVERY)]
    assert choices.count(K) == 1 and choices[-1] == K
    # a new sequence starts from the mean over every sequence's rows: not tried anew either
    assert policy.prior < 0.05 and policy.choose(seqs(3)[2:]) == 0


def test_ngram_without_matches_counts_misses(tiny_model_factory):
    """A decoding sequence given draft slots for which the n-gram drafter found no match has its
    acceptance lowered, as for a rejected draft: the policy learns that such steps gain nothing
    (they wait for the step before, which a plain step does not)."""
    path, _ = tiny_model_factory("qwen2-gqa4-tied")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=128,
              speculative_config={"method": "ngram", "num_speculative_tokens": K,
                                  "prompt_lookup_min": 4, "prompt_lookup_max": 4})
    engine = llm.engine
    engine.add_request("r", {"prompt_token_ids": list(range(3, 40))},  # no 4-gram repeats
                       SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    seq = engine.requests["r"].seqs[0]
    misses, last = 0, 0.5
    while engine.has_unfinished_requests():
        drafted = seq.num_drafted
        engine.step()
        now = engine.speculation.policy.acceptance.get(seq.seq_id, last)
        misses += now < last and seq.num_drafted == drafted  # lowered with no draft verified
        last = now
    assert misses >= 2


def test_batch_sizes_are_measured_apart():
    small, large = seqs(1), seqs(64)
    policy = measured({0: 0.010, K: 0.011}, acceptance=1, batch=small)
    assert policy.choose(small) == K
    assert policy.choose(large) == K  # unmeasured at 64: explores
    timed(policy, 64, K, 0.080)
    timed(policy, 64, 0, 0.020)
    for s in large:
        for _ in range(20):
            policy.record_acceptance(s, K, 1)  # one of four accepted: a = 0.5
    # 64 sequences x E = 1 + 0.5 + ... over 0.02 + 0.015 k: k = 0 (64 / 0.02) beats every k > 0
    assert policy.choose(large) == 0


def test_interpolates_between_measured_drafts():
    batch = seqs(2)
    policy = measured({0: 0.010, K: 0.030}, acceptance=1, batch=batch)
    assert policy._time(2, 2) == pytest.approx(0.020)


def test_fixed_k_when_not_adaptive():
    policy = DraftLengthPolicy(K, adaptive=False)
    policy.record_step(2, K, 1.0)
    policy.record_step(2, 0, 0.001)
    assert policy.choose(seqs(2)) == K


def test_adaptive_engine_output_equals_plain(tiny_model_factory):
    """The default (adaptive) path: some steps verify drafts and some do not; greedy output is
    the plain engine's either way."""
    path, hf_model = tiny_model_factory("qwen2-gqa4-tied")
    prompts = [[5 + i, 9, 13, 5 + i, 9, 13, 5 + i, 9] * 3 for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def run(**kw):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=128, **kw)
        return llm, [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]

    _, want = run()
    llm, got = run(speculative_config={"method": "draft_model", "model": str(path), "num_speculative_tokens": K})
    assert got == want
    times = llm.engine.speculation.policy.step_time
    assert (4, K) in times and (4, 0) in times  # both ends measured at this batch size
    assert llm.engine.speculation.policy.catch_up_cost > 0  # the draft's catch-up on the prompts, timed
