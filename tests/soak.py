"""A soak workload driven through the engine's public API (`LLM(...).engine`: add_request, step,
abort_request, as the server drives it), the invariants every run must keep, and the comparison of
two runs of one workload. tests/engine/test_soak_cpu.py runs a small workload on the CPU;
tests/gpu/test_soak.py a large one on the Triton path and on the reference ops, compared.

The workload: prompts of 1 to `max_prompt_len` tokens (log-uniform, so most are short and a few
long), some sharing a prefix or repeating an earlier prompt; random max_tokens; greedy, seeded and
unseeded sampling, n up to 3; stop strings, stop token ids, EOS, min_tokens; aborts mid-stream.
Requests arrive in bursts; every other burst is greedy only, so that steps of plain greedy rows
(the decode graphs' own argmax, async scheduling) run too.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hotpath import LLM, SamplingParams
from hotpath.outputs import RequestOutput
from hotpath.runner.decode_inputs import OUT_SLOTS

MODEL = "qwen3-gqa8-untied-hd"  # tiny_models: Qwen3's QK-norm, GQA 8:1, head_dim != hidden / heads
EOS = 2  # tiny_models' eos_token_id, which is <|im_end|> in the tiny chat model's tokenizer
# short strings the tiny BPE tokenizer's text is full of, so stop strings end some requests
STOP_STRINGS = ["e", "o", "in", "th", "\n", ", ", "the", "ing"]
# the reference run returns this many top logprobs for greedy requests, so a token the other run
# chose where the two part can be looked up in the reference's distribution
TOP_LOGPROBS = 5
# Two greedy runs may part only at a near tie: at the first position where their tokens differ,
# the other run's token is among the reference's TOP_LOGPROBS and the reference's logprobs of the
# two tokens differ by less than NEAR_TIE. Both runs are fp32, whose logits agree to ~1e-6.
NEAR_TIE = 1e-4
LOW_WATER = 4  # the next burst arrives when fewer requests than this are unfinished
# consecutive steps without an output after which a run counts as stuck (prefill chunks and steps
# only launched under async scheduling return none, but never this many in a row)
MAX_IDLE_STEPS = 1000


@dataclass(frozen=True)
class SoakRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    abort_after: int | None  # abort once its first sequence streamed this many tokens (0: after
    # the first step it was in the engine for, whatever that step did)
    burst: int  # the requests of a burst arrive together

    @property
    def deterministic(self) -> bool:
        """Whether its tokens depend only on its logits (greedy, or sampled with a seed), not on
        which other requests share its steps."""
        return self.params.greedy or self.params.seed is not None


@dataclass
class SoakRun:
    finals: dict[str, RequestOutput]  # request id -> its finished output
    aborted: dict[str, RequestOutput | None]  # request id -> the last output it streamed
    counts: dict[str, int | float]

    def last_output(self, request_id: str) -> RequestOutput | None:
        return self.finals.get(request_id) or self.aborted.get(request_id)


def make_soak_model(out_dir: Path, max_positions: int) -> tuple[Path, int]:
    """A tiny random Qwen3 (tests/tiny_models.py) of `max_positions` positions, with the tiny chat
    model's BPE tokenizer, so stop strings and detokenization run: (directory, vocab size)."""
    import torch
    from tiny_chat_model import make_tiny_chat_model
    from tiny_models import make_tiny_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(make_tiny_chat_model(out_dir / "chat"))
    model_dir = out_dir / "model"
    model = make_tiny_model(MODEL, model_dir, vocab_size=len(tok))
    with torch.no_grad():  # logits spread wider than the default init gives: fewer near ties
        model.lm_head.weight.normal_(0.0, 0.25)
    model.config.max_position_embeddings = max_positions
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir, len(tok)


def make_workload(
    num_requests: int, vocab_size: int, max_prompt_len: int, max_output_len: int, seed: int = 0
) -> list[SoakRequest]:
    rng = random.Random(seed)
    token_range = range(3, vocab_size)  # no special tokens in prompts

    def tokens(n: int) -> list[int]:
        return rng.choices(token_range, k=n)

    def length() -> int:
        return min(max_prompt_len, int(math.exp(rng.uniform(0.0, math.log(max_prompt_len + 1)))))

    prefixes = [tokens(length()) for _ in range(8)]
    requests: list[SoakRequest] = []
    burst = 0
    while len(requests) < num_requests:
        for _ in range(min(rng.randint(1, 24), num_requests - len(requests))):
            n = length()
            shape = rng.random()
            if shape < 0.3:  # a shared prefix, cut or extended to n tokens
                head = rng.choice(prefixes)[:n]
                prompt = head + tokens(n - len(head))
            elif shape < 0.35 and requests:  # an earlier prompt again: a full prefix-cache hit
                prompt = list(rng.choice(requests).prompt)
            else:
                prompt = tokens(n)
            params = _sampling_params(rng, vocab_size, max_output_len, greedy_only=burst % 2 == 0)
            abort_after = rng.randint(0, params.max_tokens) if rng.random() < 0.1 else None
            requests.append(SoakRequest(f"soak-{len(requests)}", prompt, params, abort_after, burst))
        burst += 1
    return requests


def _sampling_params(rng: random.Random, vocab_size: int, max_output_len: int, greedy_only: bool) -> SamplingParams:
    max_tokens = rng.randint(1, max_output_len)
    kw: dict = dict(max_tokens=max_tokens, ignore_eos=rng.random() < 0.3)
    if rng.random() < 0.3:
        kw.update(stop=rng.sample(STOP_STRINGS, rng.randint(1, 2)),
                  include_stop_str_in_output=rng.random() < 0.5)
    if rng.random() < 0.3:
        kw.update(stop_token_ids=rng.sample(range(3, vocab_size), rng.randint(1, 3)))
    if rng.random() < 0.1:
        kw.update(min_tokens=rng.randint(0, max_tokens))
    kind = rng.random()
    if greedy_only or kind < 0.4:
        # logprobs None or 0 keep a row plain greedy (the decode graph's argmax is its token)
        kw.update(temperature=0.0, n=1 if rng.random() < 0.9 else 2, logprobs=rng.choice([None, 0]))
    else:
        kw.update(temperature=rng.uniform(0.5, 1.5), n=rng.randint(1, 3), top_p=rng.choice([1.0, 0.9]),
                  top_k=rng.choice([0, 20]), min_p=rng.choice([0.0, 0.05]), logprobs=rng.choice([None, 1]))
        if kind < 0.8:
            kw.update(seed=rng.randrange(2**31))
    return SamplingParams(**kw)


def run_soak(llm: LLM, requests: list[SoakRequest], top_logprobs: int | None = None) -> SoakRun:
    """Runs the workload to the end, checking every output as it comes and the engine's state
    after the last; returns the final outputs and the run's counts. `top_logprobs`: what greedy
    requests ask for instead of their own logprobs (a reference run, for `compare`)."""
    engine = llm.engine
    specs = {r.request_id: r for r in requests}
    bursts: dict[int, list[SoakRequest]] = {}
    for r in requests:
        bursts.setdefault(r.burst, []).append(r)
    arrivals = [bursts[b] for b in sorted(bursts)]
    live: dict[str, RequestOutput | None] = {}  # unfinished request id -> its last output
    finals: dict[str, RequestOutput] = {}
    aborted: dict[str, RequestOutput | None] = {}
    steps = idle = 0
    start = time.perf_counter()
    while arrivals or live:
        if arrivals and len(live) < LOW_WATER:
            for r in arrivals.pop(0):
                params = r.params
                if top_logprobs is not None and params.greedy:
                    params = replace(params, logprobs=top_logprobs)
                engine.add_request(r.request_id, {"prompt_token_ids": r.prompt}, params)
                live[r.request_id] = None
        outputs = engine.step()
        idle = 0 if outputs else idle + 1
        assert idle < MAX_IDLE_STEPS, f"no output in {idle} steps; unfinished: {sorted(live)[:10]}"
        for out in outputs:
            rid = out.request_id
            assert rid in live, f"an output for {rid}, which is not unfinished (finished or aborted)"
            _check_stream(specs[rid], live[rid], out)
            if out.finished:
                _check_final(specs[rid], out, engine.model_config.vocab_size)
                finals[rid] = out
                del live[rid]
            else:
                live[rid] = out
        steps += 1
        for rid in [rid for rid in live if specs[rid].abort_after is not None]:
            out = live[rid]
            if (len(out.outputs[0].token_ids) if out else 0) >= specs[rid].abort_after:
                engine.abort_request(rid)
                aborted[rid] = live.pop(rid)
    seconds = time.perf_counter() - start
    assert engine.step() == [], "a step after the last request ended returned outputs"
    _check_idle(llm)
    assert finals.keys() | aborted.keys() == specs.keys() and not finals.keys() & aborted.keys()
    completions = [c for out in [*finals.values(), *aborted.values()] if out for c in out.outputs]
    finished = [c for out in finals.values() for c in out.outputs]
    counts = dict(
        requests=len(requests),
        prompt_tokens=sum(len(r.prompt) for r in requests),
        output_tokens=sum(len(c.token_ids) for c in completions),
        preemptions=engine.scheduler.num_preemptions,
        aborts=len(aborted),
        prefix_cache_hit_tokens=engine.kv_cache.prefix_hit_tokens,
        stops_by_string=sum(isinstance(c.stop_reason, str) for c in finished),
        stops_by_token=sum(c.finish_reason == "stop" and not isinstance(c.stop_reason, str) for c in finished),
        steps=steps,
        seconds=round(seconds, 1),
    )
    return SoakRun(finals, aborted, counts)


def _check_stream(spec: SoakRequest, prev: RequestOutput | None, out: RequestOutput) -> None:
    """Each output is the previous one extended: n sequences, none of whose tokens changed."""
    assert [c.index for c in out.outputs] == list(range(spec.params.n)), out.request_id
    if prev is not None:
        for old, new in zip(prev.outputs, out.outputs):
            assert new.token_ids[: len(old.token_ids)] == old.token_ids, f"{out.request_id}: tokens changed"


def _check_final(spec: SoakRequest, out: RequestOutput, vocab_size: int) -> None:
    p = spec.params
    assert out.prompt_token_ids == spec.prompt, f"{spec.request_id}: prompt changed"
    for c in out.outputs:
        what = f"{spec.request_id}[{c.index}]: {c.finish_reason} {c.stop_reason!r} after {len(c.token_ids)} tokens, {p}"
        k = len(c.token_ids)
        assert 1 <= k <= p.max_tokens and all(0 <= t < vocab_size for t in c.token_ids), what
        if c.finish_reason == "length":
            assert k == p.max_tokens, what
        else:
            assert c.finish_reason == "stop" and k >= p.min_tokens, what
            if isinstance(c.stop_reason, str):
                assert c.stop_reason in p.stop, what
            elif c.stop_reason is None:  # EOS
                assert c.token_ids[-1] == EOS and not p.ignore_eos, what
            else:
                assert c.stop_reason == c.token_ids[-1] and c.stop_reason in p.stop_token_ids, what
        if c.logprobs is not None:
            assert len(c.logprobs) == k, what
            assert all(math.isfinite(lp.logprob) and lp.logprob <= 1e-6 for e in c.logprobs for lp in e.values()), what
            assert math.isfinite(c.cumulative_logprob), what


def _check_idle(llm: LLM) -> None:
    """Nothing left behind: no request, no sequence, every KV block free, every ring row of the
    decode graphs' host output back."""
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    assert not engine.scheduler.running and not engine.scheduler.waiting
    kv = engine.kv_cache
    held = [b.block_id for b in kv.blocks if b.ref_count]
    assert not held and kv.num_free_blocks == kv.num_blocks, f"leaked blocks: {held[:20]} ({len(held)})"
    inputs = getattr(engine.executor.runner, "decode_inputs", None)  # only where decode graphs were captured
    if inputs is not None:
        assert sorted(inputs._free_slots) == list(range(OUT_SLOTS)), "a host output ring row leaked"


def compare(run: SoakRun, reference: SoakRun, requests: list[SoakRequest]) -> dict[str, int]:
    """Checks that `run` gave the reference's tokens for every request whose tokens do not depend
    on the batch (greedy, or sampled with a seed): greedy ones up to near ties (NEAR_TIE), after
    which the two are not compared further; an aborted request up to where either stopped.
    Seeded sampled sequences that part are counted, not failed: their draws are the same, but a
    draw can fall the other way where logits differ in the last bits."""
    counts = dict(compared_sequences=0, near_ties=0, compared_sampled=0, sampled_divergences=0)
    for spec in requests:
        a, b = run.last_output(spec.request_id), reference.last_output(spec.request_id)
        if not spec.deterministic or a is None or b is None:
            continue
        cut = spec.request_id in run.aborted or spec.request_id in reference.aborted
        for ca, cb in zip(a.outputs, b.outputs):
            what = f"{spec.request_id}[{ca.index}] ({spec.params})"
            counts["compared_sequences"] += 1
            counts["compared_sampled"] += not spec.params.greedy
            at = next((i for i, (x, y) in enumerate(zip(ca.token_ids, cb.token_ids)) if x != y), None)
            if at is None:
                if not cut:
                    assert (len(ca.token_ids), ca.finish_reason, ca.stop_reason) == (
                        len(cb.token_ids), cb.finish_reason, cb.stop_reason), what
            elif spec.params.greedy:
                top = cb.logprobs[at]
                x, y = ca.token_ids[at], cb.token_ids[at]
                gap = abs(top[x].logprob - top[y].logprob) if x in top else math.inf
                assert gap < NEAR_TIE, f"{what}: token {at} is {x}, the reference's {y}, logprob gap {gap}"
                counts["near_ties"] += 1
            else:
                counts["sampled_divergences"] += 1
    return counts


def report(summary: dict) -> None:
    """Prints the summary as one JSON line, and writes it to $HOTPATH_SOAK_OUT if set."""
    line = json.dumps(summary, sort_keys=True)
    print(line, flush=True)
    if out := os.environ.get("HOTPATH_SOAK_OUT"):
        Path(out).write_text(line + "\n")
