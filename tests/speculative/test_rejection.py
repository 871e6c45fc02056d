"""Speculative-draft verification (hotpath/speculative/rejection.py): greedy chains, losslessness of the
sampled rule measured by chi-square tests with negative controls, seeded reproducibility."""

import math

import pytest
import torch

from hotpath.speculative import rejection
from hotpath.speculative.rejection import VerifyOutput, verify_drafts
from hotpath.runner.sampler import Sampler
from hotpath.sampling_params import SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Significance level of every chi-square check below, and the 1 - ALPHA quantiles of the
# chi-square distribution by degrees of freedom (scipy.stats.chi2.isf(1e-3, df)).
ALPHA = 1e-3
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
# Noncentrality a chi-square check at ALPHA needs to reject with probability 0.99, by degrees of
# freedom: ncx2.sf(CHI2_CRITICAL[df], df, nc) = 0.99 (recomputed by test_stated_power).
NONCENTRALITY_99 = {1: 31.55, 2: 35.25, 3: 37.93, 4: 40.14, 5: 42.07, 6: 43.80, 7: 45.38}

VOCAB = 6  # the statistical tests' vocabulary
K = 2  # drafts per sequence in the statistical tests
TRIALS = 30000  # sequences per statistical run, all in one batch
MIN_CONDITIONAL = 10000  # fewest samples a conditional check may rest on


def random_logits(rows: int, vocab: int, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator).to(device)


def verify(logits, drafts, params, draft_probs=None, prompts=None, outputs=None,
           generators=None, suppressed=None) -> VerifyOutput:
    n = len(drafts)
    return verify_drafts(
        logits,
        drafts,
        draft_probs if draft_probs is not None else [None] * n,
        params,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        generators if generators is not None else [None] * n,
        suppressed,
    )


# ---- greedy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_emits_the_argmax_chain(device):
    """Drafts match the rows' argmax for m positions then differ: the step emits those m drafts and
    the argmax at row m (the bonus argmax of the last row when m = k; one token when k = 0)."""
    vocab = 50
    ks = [0, 1, 3, 3, 5, 2, 4, 1]
    ms = [0, 1, 0, 3, 2, 2, 4, 0]  # accepted prefix lengths; m = k: all accepted
    logits = random_logits(sum(ks) + len(ks), vocab, device, seed=1)
    best = logits.argmax(dim=-1).tolist()
    generator = torch.Generator().manual_seed(2)
    drafts, expected, row = [], [], 0
    for k, m in zip(ks, ms):
        seq = [best[row + i] for i in range(m)]
        if m < k:
            seq.append((best[row + m] + 1 + int(torch.randint(vocab - 1, (), generator=generator)))
                       % vocab)  # anything but the argmax
            seq += torch.randint(vocab, (k - m - 1,), generator=generator).tolist()
        drafts.append(seq)
        expected.append([best[row + i] for i in range(m + 1)])
        row += k + 1
    asks = [3, None, 0, 5, None, 1, 2, None]
    params = [SamplingParams(temperature=0.0, logprobs=n) for n in asks]
    out = verify(logits, drafts, params)

    assert out.num_accepted == ms
    assert out.token_ids == expected
    raw = torch.log_softmax(logits, dim=-1).cpu()
    row = 0
    for s, k in enumerate(ks):
        rows = range(row, row + ms[s] + 1)
        want = [raw[r, t].item() for r, t in zip(rows, expected[s])]
        assert out.logprobs[s] == pytest.approx(want, abs=1e-6)
        top = out.top_logprobs[s]
        assert len(top) == len(expected[s])
        for r, entries in zip(rows, top):
            values, ids = raw[r].topk(asks[s] or 1)
            assert [t for t, _ in entries] == (ids.tolist() if asks[s] else [])
            assert [v for _, v in entries] == pytest.approx(values.tolist() if asks[s] else [])
        row += k + 1

    out = verify(logits, drafts, [SamplingParams(temperature=0.0)] * len(ks))
    assert out.top_logprobs is None and out.token_ids == expected


def reference_greedy_row(row, params, prompt, history, suppressed) -> int:
    """The token the Sampler picks for one row with the given output history."""
    greedy = SamplingParams(**{**params.__dict__, "temperature": 0.0})
    out = Sampler()(row[None], [greedy], [prompt], [history], [None],
                    [suppressed] if suppressed is not None else None)
    return out.token_ids.item()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_with_penalties_and_min_tokens_matches_the_sampler_row_by_row(device):
    """Row i is judged with history output + drafts[:i]: penalties count the drafts and min_tokens
    suppression counts len(output) + i. The reference runs the Sampler on one row at a time."""
    vocab = 20
    generator = torch.Generator().manual_seed(5)
    specs = [  # params, k, accepted prefix length m, prompt, output
        (SamplingParams(frequency_penalty=1.5), 4, 4, [1, 2], [3, 3]),
        (SamplingParams(presence_penalty=2.0), 5, 3, [], [7]),
        (SamplingParams(repetition_penalty=3.0), 4, 4, [0, 1, 2, 3], []),
        (SamplingParams(repetition_penalty=0.5, frequency_penalty=-1.0), 3, 1, [4], [4, 5]),
        (SamplingParams(min_tokens=5), 4, 4, [9], [1, 2, 3]),  # rows 0, 1 below min_tokens
        (SamplingParams(min_tokens=2, frequency_penalty=0.7), 3, 3, [], []),
        (SamplingParams(), 2, 2, [], [6]),
    ]
    ks = [k for _, k, _, _, _ in specs]
    logits = random_logits(sum(ks) + len(ks), vocab, "cpu", seed=6)
    # Sequences 4 and 5 hold back token 8, which leads every row of theirs by a wide margin.
    row = 0
    for s, k in enumerate(ks):
        if s in (4, 5):
            logits[row : row + k + 1, 8] += 5.0
        row += k + 1
    suppressed = [[8] if s in (4, 5) else [] for s in range(len(specs))]
    params = [p for p, *_ in specs]
    for p in params:
        p.temperature = 0.0

    drafts, expected, changed, row = [], [], 0, 0
    for s, (p, k, m, prompt, output) in enumerate(specs):
        seq, tokens = [], []
        for i in range(k + 1):
            token = reference_greedy_row(logits[row + i], p, prompt, output + seq, suppressed[s])
            changed += token != logits[row + i].argmax().item()
            tokens.append(token)
            if i == m:
                break
            seq.append(token)
        if m < k:
            seq.append((tokens[-1] + 1 + int(torch.randint(vocab - 1, (), generator=generator)))
                       % vocab)
            seq += torch.randint(vocab, (k - m - 1,), generator=generator).tolist()
        drafts.append(seq)
        expected.append(tokens)
        row += k + 1
    assert changed >= 5  # the penalties and suppression really moved the argmax

    # A sampled sequence in the same batch, which must not change the greedy ones.
    sampled_logits = random_logits(3, vocab, "cpu", seed=7)
    out = verify(
        torch.cat([logits, sampled_logits]).to(device),
        drafts + [[1, 2]],
        params + [SamplingParams(temperature=1.0, frequency_penalty=1.0, min_tokens=3)],
        prompts=[spec[3] for spec in specs] + [[1]],
        outputs=[spec[4] for spec in specs] + [[2]],
        suppressed=suppressed + [[8]],
    )
    assert out.token_ids[:-1] == expected
    assert out.num_accepted[:-1] == [m for _, _, m, _, _ in specs]
    assert out.token_ids[4][:2] != [8, 8] and out.token_ids[4][2:] == [8, 8, 8]


def test_row_count_must_match_the_drafts_and_an_empty_batch_is_fine():
    with pytest.raises(ValueError, match="sum"):
        verify(random_logits(4, 10), [[1, 2]], [SamplingParams()])
    assert verify(torch.empty(0, 10), [], []) == VerifyOutput([], [], None, [])


# ---- losslessness of the sampled rule -----------------------------------------------------------


def expected_distribution(logits: list[float], params: SamplingParams) -> list[float]:
    """Plain-Python statement of temperature -> top-k -> top-p -> min-p (as in test_sampler)."""
    scaled = [x / params.temperature for x in logits]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    order = sorted(range(len(logits)), key=lambda i: -weights[i])
    if params.top_k > 0:
        for i in order[params.top_k :]:
            weights[i] = 0.0
    total = sum(weights)
    probs = [w / total for w in weights]
    kept, mass = [], 0.0
    for i in order:
        if probs[i] > 0 and mass < params.top_p:
            kept.append(i)
            mass += probs[i]
    probs = [probs[i] if i in kept else 0.0 for i in range(len(probs))]
    threshold = params.min_p * max(probs)
    probs = [p if p >= threshold else 0.0 for p in probs]
    total = sum(probs)
    return [p / total for p in probs]


def chi_square(tokens: list[int], expected: list[float]) -> tuple[float, int]:
    """Pearson's statistic of observed tokens against `expected` over its support, and its degrees
    of freedom; infinite when a token outside the support was observed."""
    counts = [0] * len(expected)
    for token in tokens:
        counts[token] += 1
    if any(c and p == 0.0 for c, p in zip(counts, expected)):
        return math.inf, 0
    n = len(tokens)
    support = [t for t, p in enumerate(expected) if p > 0.0]
    stat = sum((counts[t] - n * expected[t]) ** 2 / (n * expected[t]) for t in support)
    return stat, len(support) - 1


def failed_checks(out: VerifyOutput, expected: list[list[float]]) -> list[str]:
    """The emitted tokens' checks at ALPHA: the first token against p_0; the token after an
    accepted first draft against p_1; the token after two accepted drafts (the bonus) against
    p_2. Returns a description of each failed check."""
    first = [tokens[0] for tokens in out.token_ids]
    second = [t[1] for t, n in zip(out.token_ids, out.num_accepted) if n >= 1]
    third = [t[2] for t, n in zip(out.token_ids, out.num_accepted) if n >= 2]
    assert min(len(second), len(third)) >= MIN_CONDITIONAL, (len(second), len(third))
    failures = []
    for name, tokens, p in [("first", first, expected[0]), ("second", second, expected[1]),
                            ("bonus", third, expected[2])]:
        stat, df = chi_square(tokens, p)
        if not stat < CHI2_CRITICAL.get(df, 0.0):
            failures.append(f"{name}: chi2 {stat:.1f} df {df} over {len(tokens)} samples")
    return failures


def run_trials(target: torch.Tensor, params: SamplingParams, draft_dist: torch.Tensor,
               dense: bool, device: str) -> VerifyOutput:
    """TRIALS sequences with the same target rows (`target`: [K + 1, VOCAB] logits) and drafts
    drawn independently from `draft_dist` ([K, VOCAB]); the verifier is told q = draft_dist
    (dense) or one-hot at each draft (point mass)."""
    generator = torch.Generator().manual_seed(11)
    # [TRIALS, K]: column i drawn from draft_dist[i]
    drafts = torch.multinomial(draft_dist, TRIALS, replacement=True, generator=generator).T
    logits = target.repeat(TRIALS, 1).to(device)  # [TRIALS * (K + 1), VOCAB]
    q = draft_dist.to(device)
    torch.manual_seed(12)  # the global RNG draws every acceptance test and resample
    return verify(logits, drafts.tolist(), [params] * TRIALS,
                  draft_probs=[q if dense else None] * TRIALS)


def accept_every_draft(u, p_draft, q_draft):
    return torch.ones_like(p_draft, dtype=torch.bool)


def resample_from_p(p, q):
    return p


def assert_lossless(monkeypatch, target, params, draft_dist, dense, device):
    expected = [expected_distribution(row.tolist(), params) for row in target]
    out = run_trials(target, params, draft_dist, dense, device)
    assert failed_checks(out, expected) == []
    accepted = sum(out.num_accepted) / (K * TRIALS)
    assert 0.3 < accepted < 0.9, accepted  # both accepting and rejecting were exercised
    # Negative controls: each deliberately wrong rule must fail the same checks.
    for name, wrong in [("_accept", accept_every_draft), ("_residual", resample_from_p)]:
        with monkeypatch.context() as patch:
            patch.setattr(rejection, name, wrong)
            bad = run_trials(target, params, draft_dist, dense, device)
        failed = {f.split(":")[0] for f in failed_checks(bad, expected)}
        assert {"first", "second"} <= failed, f"the wrong rule {wrong.__name__} passed"
    # Neither wrong rule touches the bonus token; a bonus drawn from the row before (p_1 instead
    # of p_2) would fail its check.
    shifted = [expected[0], expected[1], expected[1]]
    assert any(f.startswith("bonus") for f in failed_checks(out, shifted))


LOSSLESS_DOC = f"""
    Each run puts {TRIALS} sequences of K = {K} drafts over a {VOCAB}-token vocabulary in one
    batch, every sequence with the same fixed target rows p_0, p_1, p_2 (different per row) and
    drafts drawn from distributions q_0, q_1 that differ from them. Three chi-square checks at
    alpha = {ALPHA} (fixed seeds, so the test is deterministic): the first emitted token against
    p_0 ({TRIALS} samples, df <= 5), the token after an accepted first draft against p_1, the
    bonus token after two accepted drafts against p_2 (each >= {MIN_CONDITIONAL} samples,
    asserted).

    Power: a true distribution p' deviating from p makes Pearson's statistic approximately
    noncentral chi-square with noncentrality n * sum((p' - p)^2 / p) >= n * 4 TV(p', p)^2 (by
    Cauchy-Schwarz). At df = 5 and alpha = 1e-3 a noncentrality of 42.07 is rejected with
    probability 0.99, so every deviation with TV >= sqrt(42.07 / n) / 2 is detected with
    probability >= 99%: TV >= 0.019 for the first token (n = {TRIALS}), TV >= 0.033 for the
    conditional checks (n >= {MIN_CONDITIONAL}); fewer degrees of freedom (truncated supports)
    only lower these. Negative controls: the same run with every draft accepted, and with the
    correction drawn from p instead of the residual max(0, p - q), must fail the first-token and
    the second-token checks (their deviations are far above these bounds), and the bonus tokens
    must fail a check against the previous row's p.
"""


def _lossless_case(seed: int, params: SamplingParams, noise: float, mode_boost: float):
    """Target logits rows [K + 1, VOCAB] and draft distributions [K, VOCAB], all different: the
    drafter's logits are the target's plus `noise` times Gaussian noise, put through the same
    transforms (as a smaller model's would be), so its distributions differ from p's, support
    included. `mode_boost` gives each target row a clear mode: a point-mass draft is accepted with
    probability p(d), and enough sequences must accept both drafts for the conditional checks.
    (Seeds and scales were picked so that every check has its samples and its counts expected
    in the conditional checks stay >= 5.)"""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(K + 1, VOCAB, generator=generator)
    if mode_boost:
        modes = torch.randint(VOCAB, (K + 1,), generator=generator)
        target[torch.arange(K + 1), modes] += mode_boost
    draft_logits = target[:K] + noise * torch.randn(K, VOCAB, generator=generator)
    draft = torch.tensor([expected_distribution(row.tolist(), params) for row in draft_logits])
    return target, draft


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("dense", "case"),
    [(True, (21, 0.7, 0.0)), (False, (31, 0.7, 4.0))],
    ids=["dense-q", "point-mass"],
)
def test_sampled_verification_is_lossless(monkeypatch, device, dense, case):
    params = SamplingParams(temperature=1.0)
    target, draft = _lossless_case(case[0], params, *case[1:])
    assert_lossless(monkeypatch, target, params, draft, dense, device)


test_sampled_verification_is_lossless.__doc__ = (
    "The emitted tokens follow the target p at temperature 1, for drafts drawn from q and "
    "verified against q (dense) or as point masses.\n" + LOSSLESS_DOC
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("params", "dense", "case"),
    [
        (SamplingParams(temperature=0.7, top_k=4, top_p=0.9), True, (32, 0.7, 0.0)),
        (SamplingParams(temperature=1.4, top_k=5, top_p=0.95), False, (24, 1.0, 3.0)),
        (SamplingParams(temperature=1.3, min_p=0.3), True, (26, 0.7, 0.0)),
    ],
    ids=["top-k-top-p-dense", "top-k-top-p-point-mass", "min-p-dense"],
)
def test_sampled_verification_is_lossless_under_transforms(
    monkeypatch, device, params, dense, case
):
    target, draft = _lossless_case(case[0], params, *case[1:])
    expected = [expected_distribution(row.tolist(), params) for row in target]
    assert all(1 < sum(p > 0 for p in row) < VOCAB for row in expected)  # truncation in force
    outside = [sum(q for q, p in zip(draft[i].tolist(), expected[i]) if p == 0) for i in range(K)]
    assert max(outside) > 0.05, outside  # some drafts fall outside the target's support
    assert_lossless(monkeypatch, target, params, draft, dense, device)


test_sampled_verification_is_lossless_under_transforms.__doc__ = (
    "With temperature, top-k, top-p, min-p on, p is the transformed distribution: the emitted "
    "tokens follow it, and drafts outside its support are never emitted.\n" + LOSSLESS_DOC
)


def test_stated_power():
    """The critical values and the 99%-power noncentralities the docstrings rely on."""
    stats = pytest.importorskip("scipy.stats")
    for df, critical in CHI2_CRITICAL.items():
        assert stats.chi2.isf(ALPHA, df) == pytest.approx(critical, abs=0.01)
        assert stats.ncx2.sf(critical, df, NONCENTRALITY_99[df]) == pytest.approx(0.99, abs=1e-3)
    assert math.sqrt(NONCENTRALITY_99[5] / TRIALS) / 2 < 0.019
    assert math.sqrt(NONCENTRALITY_99[5] / MIN_CONDITIONAL) / 2 < 0.033


# ---- randomness ---------------------------------------------------------------------------------


def seeded_generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense", [True, False], ids=["dense-q", "point-mass"])
def test_seeded_sequence_is_independent_of_the_batch(device, dense):
    vocab, k = 40, 4
    target = random_logits(k + 1, vocab, device, seed=41) * 2.0
    # A drafter close to the target, so that some drafts are accepted and some rejected.
    q = torch.softmax(target[:k].cpu() + random_logits(k, vocab, "cpu", seed=42), dim=-1)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7, frequency_penalty=0.3, logprobs=2)
    draft_q = q.to(device) if dense else None
    others = random_logits(3 + 4 + 2, vocab, device, seed=43)  # rows of k = 2, 3, 1 companions

    results = set()
    for seed in range(12):
        drafts = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed)).T[0]
        drafts = drafts.tolist()
        alone = verify(target, [drafts], [params], draft_probs=[draft_q], prompts=[[1, 2]],
                       outputs=[[3]], generators=[seeded_generator(device, seed)])
        crowded = verify(
            torch.cat([others[:3], target, others[3:]]),
            [[5, 6], drafts, [7, 8, 9], [10]],
            [SamplingParams(temperature=1.0), params, SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.5, seed=3)],
            draft_probs=[None, draft_q, None, None],
            prompts=[[4], [1, 2], [], []],
            outputs=[[], [3], [1], []],
            generators=[None, seeded_generator(device, seed), None, seeded_generator(device, 3)],
        )
        assert crowded.token_ids[1] == alone.token_ids[0]
        assert crowded.num_accepted[1] == alone.num_accepted[0]
        assert crowded.logprobs[1] == alone.logprobs[0]
        assert crowded.top_logprobs[1] == alone.top_logprobs[0]
        results.add((alone.num_accepted[0], tuple(alone.token_ids[0])))
    assert len({n for n, _ in results}) >= 3  # different seeds accept different numbers
    assert len(results) >= 8


@pytest.mark.parametrize("device", DEVICES)
def test_without_drafts_a_seeded_row_draws_the_samplers_token(device):
    """k = 0 with a generator: the same exponential race on the same distribution as the
    Sampler, so the same token for the same seed."""
    vocab, n = 300, 16
    logits = random_logits(n, vocab, device, seed=51) * 0.3
    params = [SamplingParams(temperature=0.8, top_k=50 if i % 2 else 0, top_p=0.9, seed=i)
              for i in range(n)]
    out = verify(logits, [[] for _ in range(n)], params,
                 generators=[seeded_generator(device, i) for i in range(n)])
    sampled = Sampler()(logits, params, [[]] * n, [[]] * n,
                        [seeded_generator(device, i) for i in range(n)])
    assert out.token_ids == [[t] for t in sampled.token_ids.tolist()]
    assert out.num_accepted == [0] * n
    assert len({t[0] for t in out.token_ids}) > n // 2
