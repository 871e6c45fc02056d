"""Async scheduling (the next decode step launched before this one's tokens are collected) gives
the same outputs as running every step synchronously: tokens, logprobs, texts, finish and stop
reasons, for stops, lengths, n > 1, aborts, late arrivals, preemption and chunked prefill.

On the CPU the device work is synchronous, but the pipelining logic is the one a GPU runs: the
next step is launched from the previous step's sampled ids (a tensor), before the host has them.
"""

import copy
from collections import defaultdict

import pytest
import torch

from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.sampling_params import SamplingParams

from output_diff import first_difference  # tests/, on sys.path through conftest.py

MODEL = "qwen3-gqa8-untied-hd"


def make_engine(path, async_scheduling: bool, **kwargs) -> Engine:
    kwargs = {"skip_tokenizer_init": True, "max_model_len": 256, **kwargs}
    return Engine(EngineArgs(model=str(path), device="cpu", async_scheduling=async_scheduling, **kwargs))


def snapshot(out) -> tuple:
    return out.finished, tuple(
        (c.index, tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob,
         copy.deepcopy(c.logprobs))  # as emitted: the engine goes on appending to its list
        for c in out.outputs
    )


def drive(engine: Engine, requests: list, abort_after: dict | None = None, late: dict | None = None) -> dict:
    """Runs `requests` [(id, prompt, params)] to the end; returns each request's outputs as
    emitted. `abort_after` {id: k} aborts a request once it has emitted k tokens; `late`
    {(id, k): request} adds a request once request id has emitted k tokens (events tied to tokens,
    not steps: async scheduling emits a step's tokens one step later)."""
    abort_after, late = dict(abort_after or {}), dict(late or {})
    for request in requests:
        engine.add_request(*request)
    history = defaultdict(list)
    while engine.has_unfinished_requests():
        for out in engine.step():
            history[out.request_id].append(snapshot(out))
            emitted = len(out.outputs[0].token_ids)
            if out.request_id in abort_after and emitted >= abort_after[out.request_id] and not out.finished:
                del abort_after[out.request_id]
                engine.abort_request(out.request_id)
            for (rid, k), request in list(late.items()):
                if rid == out.request_id and emitted >= k:
                    del late[rid, k]
                    engine.add_request(*request)
    assert not late and all(s.num_pending_tokens == 0 for s in engine.scheduler.running)
    return history


def assert_same(sync: dict, overlapped: dict) -> None:
    """Same final outputs; every output async scheduling emitted is one sync emitted too, in order
    (a drained step and the step after it may reach the caller as one output). Tokens, texts and
    reasons must match exactly, logprobs up to rounding: an overlapped step can carry rows of
    sequences that just finished, and a batch of another shape may sum in another order."""
    assert sync.keys() == overlapped.keys()
    for rid, outs in sync.items():
        diff = first_difference(overlapped[rid][-1], outs[-1])
        assert diff is None, (rid, diff)
        remaining = iter(outs)
        assert all(any(first_difference(o, s) is None for s in remaining) for o in overlapped[rid]), rid


class Overlaps:
    """Counts the launches made while another step was still uncollected."""

    def __init__(self, engine: Engine, monkeypatch) -> None:
        runner = engine.executor.runner
        launch, collect = runner.launch, runner.collect
        self.in_flight, self.count = 0, 0

        def counted_launch(*args, **kwargs):
            self.count += self.in_flight > 0
            self.in_flight += 1
            return launch(*args, **kwargs)

        def counted_collect(step):
            self.in_flight -= 1
            return collect(step)

        monkeypatch.setattr(runner, "launch", counted_launch)
        monkeypatch.setattr(runner, "collect", counted_collect)


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    path, hf_model = tiny_model_factory(MODEL)
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
               for n in (5, 17, 33, 2, 40)]
    engine = make_engine(path, False)
    free = [list(o[-1][1][0][1]) for o in drive(engine, [
        (str(i), {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        for i, p in enumerate(prompts)]).values()]
    return path, prompts, free  # free[i]: prompt i's greedy continuation


def compare(path, requests, monkeypatch, **kwargs) -> tuple[dict, Engine]:
    sync_engine = make_engine(path, False, **kwargs)
    sync = drive(sync_engine, requests)
    engine = make_engine(path, True, **kwargs)
    overlaps = Overlaps(engine, monkeypatch)
    overlapped = drive(engine, requests)
    assert_same(sync, overlapped)
    assert overlaps.count > 0
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks  # nothing leaked
    if not sync_engine.scheduler.num_preemptions:  # (preemption moves blocks in its own time)
        # the prefix cache holds the same blocks: none computed only by a dropped step
        assert engine.kv_cache.cached.keys() == sync_engine.kv_cache.cached.keys()
    return sync, engine


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, **{"ignore_eos": True, "max_tokens": 16, **kwargs})


def test_plain_greedy_lengths_stops_and_n(model, monkeypatch):
    path, prompts, free = model
    requests = [
        ("len", {"prompt_token_ids": prompts[0]}, greedy(max_tokens=11, logprobs=0)),
        # stops at its 5th token while the others go on: the step after is launched with it
        ("stop", {"prompt_token_ids": prompts[1]}, greedy(stop_token_ids=[free[1][4]], n=2)),
        ("one", {"prompt_token_ids": prompts[2]}, greedy(max_tokens=1)),
        ("two", {"prompt_token_ids": prompts[3]}, greedy(max_tokens=2, logprobs=0)),
        ("long", {"prompt_token_ids": prompts[4]}, greedy(max_tokens=20)),
    ]
    out, _ = compare(path, requests, monkeypatch)
    assert out["stop"][-1][1][0][3] == "stop" and len(out["stop"][-1][1][0][1]) == 5


def test_eos_stops_every_sequence_at_once(model, monkeypatch):
    """Every sequence stops in the same step: the step launched after it computes only tokens
    that are discarded, and is drained by the next call."""
    path, prompts, free = model
    eos = free[0][3]
    requests = [("a", {"prompt_token_ids": prompts[0]}, SamplingParams(temperature=0, max_tokens=16))]
    sync_engine, async_engine = make_engine(path, False), make_engine(path, True)
    for engine in (sync_engine, async_engine):
        engine.eos_token_ids = {eos}
    sync, overlapped = drive(sync_engine, requests), drive(async_engine, requests)
    assert_same(sync, overlapped)
    assert sync["a"][-1][1][0][1] == tuple(free[0][:4])
    assert async_engine._in_flight is not None  # the discarded step, left for the next call
    later = drive(async_engine, [("b", {"prompt_token_ids": prompts[1]}, greedy(max_tokens=3))])
    assert later["b"][-1][1][0][1] == tuple(free[1][:3])


def test_a_stop_token_that_fills_a_block(model, monkeypatch):
    """The stop token's K/V, computed only by the dropped step, would complete a block: that block
    must not enter the prefix cache (compare() checks the cache holds the same blocks)."""
    path, prompts, _ = model
    engine = make_engine(path, False)
    base = prompts[4] + prompts[2]  # 73 tokens to take prompts of any length from
    for length in range(3, 40):
        free = drive(engine, [(str(length), {"prompt_token_ids": base[:length]}, greedy(max_tokens=20))])
        tokens = list(free[str(length)][-1][1][0][1])
        # a first occurrence at index k stops there; its position length + k ends a block
        k = next((k for k, t in enumerate(tokens) if t not in tokens[:k] and (length + k + 1) % 16 == 0), None)
        if k is not None:
            break
    requests = [("a", {"prompt_token_ids": base[:length]}, greedy(max_tokens=20, stop_token_ids=[tokens[k]])),
                ("b", {"prompt_token_ids": prompts[0]}, greedy(max_tokens=20))]
    out, _ = compare(path, requests, monkeypatch)
    assert out["a"][-1][1][0][1] == tuple(tokens[: k + 1])


def test_rows_that_need_the_sampler_drain_the_pipeline(model, monkeypatch):
    path, prompts, free = model
    requests = [
        ("plain", {"prompt_token_ids": prompts[0]}, greedy(max_tokens=20)),
        # suppression of its stop id in force for 6 tokens, then plain greedy
        ("min", {"prompt_token_ids": prompts[1]}, greedy(min_tokens=6, stop_token_ids=[free[1][2]])),
        ("seeded", {"prompt_token_ids": prompts[2]}, SamplingParams(temperature=0.9, seed=7, max_tokens=5)),
        ("top", {"prompt_token_ids": prompts[3]}, greedy(max_tokens=4, logprobs=2)),
        ("penalty", {"prompt_token_ids": prompts[4]}, greedy(max_tokens=8, repetition_penalty=1.3)),
    ]
    compare(path, requests, monkeypatch)


def test_min_tokens_holds_a_stop_back_under_overlap(model, monkeypatch):
    path, prompts, free = model
    stop = free[0][1]
    first = free[0].index(stop)
    requests = [("a", {"prompt_token_ids": prompts[0]}, greedy(stop_token_ids=[stop], min_tokens=first + 2))]
    out, _ = compare(path, requests, monkeypatch)
    assert len(out["a"][-1][1][0][1]) >= first + 2


def test_abort_and_late_arrivals(model, monkeypatch):
    path, prompts, _ = model
    requests = [(str(i), {"prompt_token_ids": p}, greedy(max_tokens=12)) for i, p in enumerate(prompts[:3])]
    late = {("0", 3): ("late", {"prompt_token_ids": prompts[3]}, greedy(max_tokens=6)),
            ("1", 7): ("later", {"prompt_token_ids": prompts[4]}, greedy(max_tokens=4))}
    abort_after = {"2": 5}
    sync = drive(make_engine(path, False), requests, abort_after, late)
    engine = make_engine(path, True)
    overlapped = drive(engine, requests, abort_after, late)
    assert_same(sync, overlapped)
    assert len(sync["2"][-1][1][0][1]) == 5 and "2" not in engine.requests
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


@pytest.mark.parametrize("kwargs", [
    dict(num_gpu_blocks_override=12, max_model_len=128, enable_prefix_caching=False),  # preemption
    dict(num_gpu_blocks_override=12, max_model_len=128, max_num_batched_tokens=16),  # + chunks, hits
    dict(max_num_seqs=2),  # waiting requests admitted as others finish
])
def test_preemption_chunks_and_admissions(model, monkeypatch, kwargs):
    path, prompts, free = model
    requests = [(str(i), {"prompt_token_ids": p}, greedy(max_tokens=24)) for i, p in enumerate(prompts)]
    requests += [("again", {"prompt_token_ids": prompts[2] + free[2][:10]}, greedy(max_tokens=6)),
                 ("stop", {"prompt_token_ids": prompts[1]}, greedy(stop_token_ids=[free[1][8]]))]
    _, engine = compare(path, requests, monkeypatch, **kwargs)
    assert (engine.scheduler.num_preemptions > 0) == ("num_gpu_blocks_override" in kwargs)


def test_decodes_the_budget_left_out(model, monkeypatch):
    """A budget of 2 tokens leaves the third decode out until the first's last token is in flight:
    the step after has a row with a pending token and one without (an eager step takes the one
    from the device, the other from the host; a graph step would wait for the first)."""
    path, _, _ = model
    requests = [(str(i), {"prompt_token_ids": [5 + i]}, greedy(max_tokens=m)) for i, m in enumerate((3, 10, 10))]
    compare(path, requests, monkeypatch, max_num_batched_tokens=2)


def test_mixed_steps_overlap(model, monkeypatch):
    """A step that mixes decodes with prefill chunks stays in flight while the next is launched
    (its host work hides behind the device's), with the outputs of running it synchronously."""
    path, prompts, free = model
    requests = [(str(i), {"prompt_token_ids": p}, greedy(max_tokens=6 + 3 * i)) for i, p in enumerate(prompts)]
    sync = drive(make_engine(path, False, max_num_seqs=2, max_num_batched_tokens=16), requests)
    engine = make_engine(path, True, max_num_seqs=2, max_num_batched_tokens=16)
    runner, launch, collect = engine.executor.runner, engine.executor.runner.launch, engine.executor.runner.collect
    uncollected, mixed_overlaps = [], []

    def tracked_launch(scheduled, prev=None, mask_follows=False):
        mixed_overlaps.extend(step for step in uncollected
                              if any(n > 1 for _, n in step.scheduled) and any(n == 1 for _, n in step.scheduled))
        step = launch(scheduled, prev, mask_follows)
        uncollected.append(step)
        return step

    def tracked_collect(step):
        uncollected.remove(step)
        return collect(step)

    monkeypatch.setattr(runner, "launch", tracked_launch)
    monkeypatch.setattr(runner, "collect", tracked_collect)
    assert_same(sync, drive(engine, requests))
    assert mixed_overlaps, "no mixed step stayed in flight"
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_stop_strings(tiny_chat_model, monkeypatch):
    engine = make_engine(tiny_chat_model, False, skip_tokenizer_init=False)
    prompt = "Hello, world! How are"
    free = drive(engine, [("free", prompt, greedy(max_tokens=24))])["free"][-1][1][0][2]
    stop = free[len(free) // 3 : len(free) // 3 + 3]
    assert stop.strip(), free
    requests = [
        ("cut", prompt, greedy(max_tokens=24, stop=[stop])),
        ("kept", prompt, greedy(max_tokens=24, stop=[stop], include_stop_str_in_output=True)),
        ("free", "def add(a, b):", greedy(max_tokens=10)),
    ]
    out, _ = compare(tiny_chat_model, requests, monkeypatch, skip_tokenizer_init=False)
    assert out["cut"][-1][1][0][4] == stop and out["kept"][-1][1][0][2].endswith(stop)


def test_off_by_default_on_the_cpu(model):
    path, _, _ = model
    engine = Engine(EngineArgs(model=str(path), device="cpu", skip_tokenizer_init=True, max_model_len=64))
    assert not engine.async_scheduling


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_latency_bench_counts_every_token_once(model, async_scheduling):
    """The latency bench times intervals between steps that return tokens: one interval per
    token after the first, whether or not a step returns before its tokens are collected."""
    from hotpath.bench.latency import _run_batch

    path, prompts, _ = model
    engine = make_engine(path, async_scheduling)
    ttft, steps = _run_batch(engine, prompts[:3], 9)
    assert ttft > 0 and len(steps) == 8 and all(t > 0 for t in steps)
    assert engine._in_flight is None  # the last tokens were collected, nothing left running
