import math
from collections import Counter

import pytest
import torch

from hotpath.runner.sampler import (
    Sampler,
    SamplerOutput,
    apply_penalties,
    probabilities,
    process_logits,
    suppress_below_min_tokens,
)
from hotpath.sampling_params import SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# 0.999 quantiles of the chi-square distribution by degrees of freedom.
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def random_logits(num_seqs: int, vocab: int, device: str, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_seqs, vocab, generator=generator).to(device)


def run(
    logits, params, prompts=None, outputs=None, generators=None, suppressed=None
) -> SamplerOutput:
    n = logits.shape[0]
    return Sampler()(
        logits,
        params,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        generators if generators is not None else [None] * n,
        suppressed,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_is_argmax(device):
    logits = random_logits(16, 100, device)
    out = run(logits, [SamplingParams(temperature=0.0)] * 16)
    assert out.token_ids.dtype == torch.int64 and out.token_ids.device == logits.device
    assert torch.equal(out.token_ids, logits.argmax(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_are_raw_log_softmax_and_true_top_k(device):
    logits = random_logits(4, 50, device)
    params = [
        SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.5),
        SamplingParams(temperature=0.3, logprobs=2, presence_penalty=1.0),
        SamplingParams(temperature=1.7, top_k=3),
        SamplingParams(temperature=1.0, logprobs=0),
    ]
    out = run(logits, params, prompts=[[1, 2, 3]] * 4, outputs=[[4, 4, 5]] * 4)
    expected = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.logprobs, expected.gather(1, out.token_ids[:, None]).squeeze(1))
    assert out.top_logprobs.shape == out.top_logprob_ids.shape == (4, 5)
    assert out.top_logprob_ids.dtype == torch.int64
    true_values, true_ids = expected.topk(5, dim=-1)
    assert torch.equal(out.top_logprob_ids, true_ids)
    assert torch.allclose(out.top_logprobs, true_values)
    assert torch.all(out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:])


def test_no_top_logprobs_when_nobody_asked():
    out = run(random_logits(3, 20, "cpu"), [SamplingParams()] * 3)
    assert out.top_logprobs is None and out.top_logprob_ids is None
    assert out.logprobs.shape == (3,) and out.logprobs.dtype == torch.float32


def test_input_logits_are_not_modified():
    logits = random_logits(2, 30, "cpu")
    before = logits.clone()
    params = [
        SamplingParams(repetition_penalty=2.0, top_k=3, top_p=0.5, min_p=0.1, min_tokens=2)
    ] * 2
    run(logits, params, prompts=[[0, 1]] * 2, outputs=[[2]] * 2, suppressed=[[3]] * 2)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-6),
        SamplingParams(temperature=1.0, min_p=1.0),
    ],
    ids=["top_k=1", "top_p=1e-6", "min_p=1"],
)
def test_truncation_to_one_token_equals_greedy(device, params):
    # Flat logits (scale 0.1) so that without truncation the sample would rarely be the argmax.
    logits = random_logits(64, 200, device) * 0.1
    out = run(logits, [params] * 64)
    assert torch.equal(out.token_ids, logits.argmax(-1))


def expected_distribution(logits: list[float], params: SamplingParams) -> list[float]:
    """Plain-Python statement of temperature -> top-k -> top-p -> min-p."""
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


def assert_matches_distribution(tokens: torch.Tensor, expected: list[float]) -> None:
    counts = torch.bincount(tokens.cpu(), minlength=len(expected)).tolist()
    num = len(tokens)
    for token, p in enumerate(expected):
        if p == 0.0:
            assert counts[token] == 0, f"token {token} is outside the support but was drawn"
    support = [t for t, p in enumerate(expected) if p > 0]
    chi2 = sum((counts[t] - num * expected[t]) ** 2 / (num * expected[t]) for t in support)
    assert chi2 < CHI2_CRITICAL[len(support) - 1], (chi2, counts, expected)


# The logits row is torch.randn(8) with seed 0. At T=1.5, top-k=5 then top-p=0.7 keeps 3 tokens
# (top-p over the renormalized top-5); top-p over the full distribution would keep 4.
DISTRIBUTION_CASES = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.5, top_k=5, top_p=0.7),
    SamplingParams(temperature=1.0, top_k=6),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", DISTRIBUTION_CASES, ids=repr)
def test_empirical_distribution_global_rng(device, params):
    row = random_logits(1, 8, "cpu")[0]
    expected = expected_distribution(row.tolist(), params)
    assert 1 < sum(p > 0 for p in expected)
    num = 20000
    torch.manual_seed(1234)
    out = run(row.to(device).expand(num, 8), [params] * num)
    assert_matches_distribution(out.token_ids, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_probabilities_are_the_distribution_sample_draws_from(device):
    rows = random_logits(len(DISTRIBUTION_CASES), 8, "cpu")
    probs = probabilities(rows.to(device), DISTRIBUTION_CASES)
    assert probs.dtype == torch.float32 and probs.shape == rows.shape
    expected = [expected_distribution(row.tolist(), p) for row, p in zip(rows, DISTRIBUTION_CASES)]
    assert torch.allclose(probs.cpu(), torch.tensor(expected), atol=1e-6)
    assert torch.equal(probs.cpu() == 0, torch.tensor(expected) == 0)  # cut tokens are exactly 0


@pytest.mark.parametrize("device", DEVICES)
def test_process_logits_is_penalties_then_suppression(device):
    logits = random_logits(3, 30, device)
    params = [
        SamplingParams(repetition_penalty=1.4, frequency_penalty=0.5, min_tokens=3),
        SamplingParams(presence_penalty=1.0, min_tokens=1),
        SamplingParams(),
    ]
    prompts, outputs, suppressed = [[1, 2]] * 3, [[3, 3], [4], []], [[5, 6]] * 3
    got = process_logits(logits, params, prompts, outputs, suppressed)
    expected = suppress_below_min_tokens(
        apply_penalties(logits, params, prompts, outputs), params, outputs, suppressed
    )
    assert torch.equal(got, expected)
    assert got[0, 5] == got[0, 6] == float("-inf") and got[1, 5] != float("-inf")
    assert torch.equal(process_logits(logits, params, prompts, outputs),
                       apply_penalties(logits, params, prompts, outputs))
    assert process_logits(logits, [SamplingParams()] * 3, prompts, outputs) is logits


@pytest.mark.parametrize("device", DEVICES)
def test_empirical_distribution_seeded_rows(device):
    params = DISTRIBUTION_CASES[1]
    row = random_logits(1, 8, "cpu")[0]
    expected = expected_distribution(row.tolist(), params)
    num = 3000
    generators = [seeded_generator(device, seed) for seed in range(num)]
    out = run(row.to(device).expand(num, 8), [params] * num, generators=generators)
    assert_matches_distribution(out.token_ids, expected)


def seeded_generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def draw_sequence(logits_steps, index, params, generators):
    """Sample `len(logits_steps)` steps and return the tokens of row `index`."""
    tokens = []
    for logits in logits_steps:
        tokens.append(run(logits, params, generators=generators).token_ids[index].item())
    return tokens


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_tokens_whatever_the_batch(device):
    vocab, steps = 1000, 20
    seeded_rows = random_logits(steps, vocab, device, seed=1) * 0.5  # one row per step
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7)

    def batch(step: int, companions: int, position: int, seed: int) -> torch.Tensor:
        rows = random_logits(companions, vocab, device, seed=seed + step)
        return torch.cat([rows[:position], seeded_rows[step : step + 1], rows[position:]])

    alone = draw_sequence(
        [seeded_rows[i : i + 1] for i in range(steps)], 0, [seeded],
        [seeded_generator(device, 7)],
    )
    companions_a = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)]
    in_batch_a = draw_sequence(
        [batch(i, 2, 1, seed=100) for i in range(steps)], 1,
        [companions_a[0], seeded, companions_a[1]],
        [None, seeded_generator(device, 7), None],
    )
    companions_b = [
        SamplingParams(temperature=1.2, top_k=10, seed=3),
        SamplingParams(),
        SamplingParams(min_p=0.1),
    ]
    in_batch_b = draw_sequence(
        [batch(i, 3, 3, seed=200) for i in range(steps)], 3,
        companions_b + [seeded],
        [seeded_generator(device, 3), None, None, seeded_generator(device, 7)],
    )
    assert alone == in_batch_a == in_batch_b
    assert len(set(alone)) > steps // 2  # really sampled, not a constant


@pytest.mark.parametrize("device", DEVICES)
def test_different_seeds_differ(device):
    logits_steps = [random_logits(1, 1000, device, seed=s) * 0.5 for s in range(20)]
    params = [SamplingParams(temperature=1.0)]

    def draws(seed: int) -> list[int]:
        return draw_sequence(logits_steps, 0, params, [seeded_generator(device, seed)])

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def greedy_choice(logits: list[float], params: SamplingParams, prompt=(), output=()) -> int:
    params.temperature = 0.0
    out = run(torch.tensor([logits]), [params], prompts=[list(prompt)], outputs=[list(output)])
    return out.token_ids.item()


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    positive = [2.0, 1.9, -3.0, -3.0]
    assert greedy_choice(positive, SamplingParams(repetition_penalty=1.2)) == 0
    # 2 / 1.2 < 1.9, whether token 0 was seen in the prompt or the output.
    assert greedy_choice(positive, SamplingParams(repetition_penalty=1.2), prompt=[0]) == 1
    assert greedy_choice(positive, SamplingParams(repetition_penalty=1.2), output=[0]) == 1
    assert greedy_choice(positive, SamplingParams(repetition_penalty=1.2), prompt=[2, 3]) == 0
    negative = [-1.0, -1.1, -3.0, -3.0]
    # -1 * 1.2 < -1.1
    assert greedy_choice(negative, SamplingParams(repetition_penalty=1.2), prompt=[0]) == 1
    # A penalty below 1 rewards seen tokens.
    assert greedy_choice(negative, SamplingParams(repetition_penalty=0.8), prompt=[1]) == 1


def test_presence_penalty_counts_output_tokens_once_and_ignores_the_prompt():
    logits = [1.0, 0.6, -2.0]
    params = SamplingParams(presence_penalty=0.5)
    assert greedy_choice(logits, params, prompt=[0, 0, 0]) == 0
    assert greedy_choice(logits, params, output=[0]) == 1  # 1.0 - 0.5 < 0.6
    # Presence does not grow with the count: 1.0 - 0.5 = 0.5 still beats 0.45.
    assert greedy_choice([1.0, 0.45, -2.0], params, output=[0, 0, 0, 0]) == 0


def test_frequency_penalty_grows_with_the_count():
    logits = [1.0, 0.6, -2.0]
    params = SamplingParams(frequency_penalty=0.3)
    assert greedy_choice(logits, params, prompt=[0, 0, 0]) == 0
    assert greedy_choice(logits, params, output=[0]) == 0  # 0.7 > 0.6
    assert greedy_choice(logits, params, output=[0, 0]) == 1  # 0.4 < 0.6
    assert greedy_choice([0.0, 0.2, -2.0], SamplingParams(frequency_penalty=-0.3), output=[0]) == 0


def reference_penalties(
    row: list[float], params: SamplingParams, prompt: list[int], output: list[int]
) -> list[float]:
    row = list(row)
    for token in set(prompt) | set(output):
        rp = params.repetition_penalty
        row[token] = row[token] / rp if row[token] > 0 else row[token] * rp
    for token, count in Counter(output).items():
        row[token] -= params.frequency_penalty * count + params.presence_penalty
    return row


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_match_per_row_reference(device):
    vocab = 64
    generator = torch.Generator().manual_seed(3)
    logits = random_logits(6, vocab, device)
    params = [
        SamplingParams(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.25),
        SamplingParams(),
        SamplingParams(repetition_penalty=0.7),
        SamplingParams(presence_penalty=-1.0),
        SamplingParams(frequency_penalty=1.5),
        SamplingParams(repetition_penalty=2.0, frequency_penalty=-0.5),
    ]
    lengths = [(30, 12), (5, 5), (0, 9), (17, 0), (1, 40), (0, 0)]
    prompts = [torch.randint(vocab, (p,), generator=generator).tolist() for p, _ in lengths]
    # Output ids from a quarter of the vocab, so that they repeat.
    outputs = [torch.randint(vocab // 4, (o,), generator=generator).tolist() for _, o in lengths]
    got = apply_penalties(logits, params, prompts, outputs)
    expected = [
        reference_penalties(logits[i].tolist(), params[i], prompts[i], outputs[i]) for i in range(6)
    ]
    assert torch.allclose(got.cpu(), torch.tensor(expected), atol=1e-6)
    assert not torch.equal(got, logits)


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_suppresses_given_ids_until_reached(device):
    logits = random_logits(3, 40, device)
    best = logits.argmax(-1).tolist()
    second = logits.topk(2, dim=-1).indices[:, 1].tolist()
    params = [
        SamplingParams(temperature=0.0, min_tokens=3),
        SamplingParams(temperature=0.0, min_tokens=3),
        SamplingParams(temperature=0.0),
    ]
    outputs = [[5, 6], [5, 6, 7], []]  # row 0 is below min_tokens, row 1 has reached it
    suppressed = [[best[0]], [best[1]], [best[2]]]
    out = run(logits, params, outputs=outputs, suppressed=suppressed)
    assert out.token_ids.tolist() == [second[0], best[1], best[2]]

    # Suppression comes before top-k: with the 2 best suppressed, top_k=3 draws ranks 3 to 5.
    top5 = logits[0].topk(5).indices.tolist()
    sampled = SamplingParams(temperature=1.0, top_k=3, min_tokens=1)
    torch.manual_seed(0)
    out = run(logits[0:1].expand(500, 40), [sampled] * 500, suppressed=[top5[:2]] * 500)
    assert set(out.token_ids.tolist()) == set(top5[2:])
