"""Structured output through LLM.generate on the tiny chat checkpoint (random weights, a real
byte-level BPE tokenizer): whatever the model would say, the output follows its constraint.
Async scheduling is on, so each step's mask is filled while the next forward is in flight."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest

from hotpath.llm import LLM
from hotpath.sampling_params import SamplingParams, StructuredOutputsParams

# bounded everywhere (enums, ranges, short strings, few items), so a random model completes it
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "viewer"]},
        "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                     "main": {"type": "boolean"}},
                    "required": ["zip", "main"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Hello, world!", "def add(a, b):", "The quick brown fox", "for i in range(10):"]


@pytest.fixture(scope="module")
def llm(tiny_chat_model):
    return LLM(str(tiny_chat_model), device="cpu", max_model_len=256, async_scheduling=True)


def constrained(seed: int | None = None, temperature: float = 1.0, max_tokens: int = 120, n: int = 1,
                stop: list[str] | None = None, **constraint) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, n=n, stop=stop,
                          structured_outputs=StructuredOutputsParams(**constraint))


def test_json_schema_outputs_validate(llm):
    params = [constrained(seed=i, json=SCHEMA) for i in range(2)] + [constrained(temperature=0.0, json=SCHEMA)]
    outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text  # ended by the grammar, not max_tokens
        jsonschema.validate(json.loads(c.text), SCHEMA)


def test_regex_choice_grammar(llm):
    regex = r"[a-z]{2,5}-[0-9]{3}"
    choices = ["yes", "no", "not sure"]
    lark = 'start: "call(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/'
    gbnf = 'root ::= "x=" [0-9] [0-9]? ";"'
    params = ([constrained(seed=i, regex=regex) for i in range(3)] + [constrained(seed=i, choice=choices) for i in range(3)]
              + [constrained(seed=1, grammar=lark, max_tokens=60), constrained(seed=2, grammar=gbnf)])
    outs = [o.outputs[0] for o in llm.generate(PROMPTS * 2, params, use_tqdm=False)]
    for c in outs[:3]:
        assert re.fullmatch(regex, c.text) and c.finish_reason == "stop", c.text
    for c in outs[3:6]:
        assert c.text in choices and c.finish_reason == "stop", c.text
    assert re.fullmatch(r"call\([0-9]{1,2}(,[0-9]{1,2})*\)", outs[6].text) or outs[6].finish_reason == "length"
    assert re.fullmatch(r"x=[0-9][0-9]?;", outs[7].text), outs[7].text


def test_json_object_and_n(llm):
    # n = 2 sequences, each with a matcher of its own, diverging under sampling
    out = llm.generate(PROMPTS[0], constrained(seed=3, n=2, max_tokens=40, json_object=True), use_tqdm=False)[0]
    assert len(out.outputs) == 2 and out.outputs[0].token_ids != out.outputs[1].token_ids
    for c in out.outputs:  # an unfinished one (a random model may write a long key) is a JSON prefix
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:
            assert c.text.startswith("{")


def test_unconstrained_rows_keep_their_tokens(llm):
    """Greedy unconstrained rows beside constrained ones get the tokens they get alone."""
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(PROMPTS[:2], plain, use_tqdm=False)
    mixed = llm.generate(PROMPTS[:2] * 2, [plain, plain, constrained(temperature=0.0, regex="[a-f]{4,8}"),
                                           constrained(seed=1, choice=["left", "right"])], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == [o.outputs[0].token_ids for o in alone]
    assert re.fullmatch("[a-f]{4,8}", mixed[2].outputs[0].text) and mixed[3].outputs[0].text in ("left", "right")


def test_stop_string_ends_a_constrained_output(llm):
    out = llm.generate(PROMPTS[1], constrained(temperature=0.0, stop=['"age"'], json=SCHEMA),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == '"age"'
    assert out.text.startswith('{"name": "') and out.text.endswith(", ")


@pytest.mark.parametrize("constraint, reason", [
    ({"regex": "(unclosed"}, "unclosed group"),
    ({"grammar": "start: undefined_rule"}, "undefined_rule"),
    ({"json": {"type": "bogus"}}, "bogus"),
])
def test_bad_constraint_is_refused_at_add(llm, constraint, reason):
    engine = llm.engine
    with pytest.raises(ValueError, match=reason):
        engine.add_request("bad", "Hello", SamplingParams(structured_outputs=constraint))
    assert not engine.has_unfinished_requests() and not engine.scheduler.waiting
    assert llm.generate(PROMPTS[0], constrained(seed=0, choice=["ok"]), use_tqdm=False)[0].outputs[0].text == "ok"


def test_compiles_are_cached(llm):
    cache = llm.engine.structured.cache
    llm.generate(PROMPTS[:2], [constrained(seed=0, regex="[0-9]{4}")] * 2, use_tqdm=False)
    size = len(cache)
    llm.generate(PROMPTS[2], constrained(seed=1, regex="[0-9]{4}"), use_tqdm=False)
    assert len(cache) == size and cache.get(("regex", "[0-9]{4}")).done()


def test_a_request_waits_for_its_compile(llm, monkeypatch):
    """While a grammar compiles, its request waits and the others run; then it runs too."""
    structured = llm.engine.structured
    gate = threading.Event()
    compile_fn = structured.cache._compile
    monkeypatch.setattr(structured.cache, "_compile", lambda grammar: (gate.wait(30), compile_fn(grammar))[1])
    engine = llm.engine
    engine.add_request("slow", PROMPTS[0], constrained(seed=0, regex="[a-z]{3}!"))
    engine.add_request("plain", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    finished = {}
    while "plain" not in finished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert "slow" not in finished and engine.scheduler.waiting  # still compiling, still queued
    gate.set()
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert re.fullmatch(r"[a-z]{3}!", finished["slow"].outputs[0].text)


def test_speculation_skips_constrained_rows(tiny_chat_model):
    """n-gram speculation on: the constrained request verifies no drafts and still validates;
    an unconstrained greedy request beside it drafts (its repetitive prompt has n-gram matches)."""
    llm = LLM(str(tiny_chat_model), device="cpu", max_model_len=256, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "adaptive": False})
    repeat = "a b c a b c a b c a b c a b c"
    regex = r"\[[0-9]{1,3}(, [0-9]{1,3}){2,4}\]"
    outs = llm.generate([repeat, repeat], [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                                           constrained(seed=4, regex=regex)], use_tqdm=False)
    assert outs[0].metrics["spec_num_draft_tokens"] > 0
    assert outs[1].metrics["spec_num_draft_tokens"] == 0
    assert re.fullmatch(regex, outs[1].outputs[0].text), outs[1].outputs[0].text


def test_worker_processes_apply_the_mask(tiny_chat_model, llm):
    """Through a worker process (the plan and the mask cross as JSON frames), constrained outputs
    equal the in-process engine's (greedy)."""
    params = [constrained(temperature=0.0, regex="[a-z]{2,6}!"), constrained(temperature=0.0, choice=["up", "down"]),
              SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)]
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)]
    mp = LLM(str(tiny_chat_model), device="cpu", max_model_len=256, distributed_executor_backend="mp")
    try:
        got = [o.outputs[0].token_ids for o in mp.generate(PROMPTS[:3], params, use_tqdm=False)]
    finally:
        mp.engine.shutdown()
    assert got == want
