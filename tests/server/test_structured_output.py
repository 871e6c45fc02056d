"""Structured output through `hotpath serve` and the official openai client: OpenAI's
response_format and vLLM's structured_outputs field, in chat and completions; a constraint that
cannot compile is a 400 naming the reason, and the server keeps serving."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 14},
                   "stops": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
    "required": ["city", "days", "stops"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Plan a trip as JSON."}]


def test_chat_json_schema(client):
    out = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=80, temperature=1.0, seed=7, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}})
    for choice in out.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_chat_json_object_streamed(client):
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=0.0,
                                            response_format={"type": "json_object"}, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.startswith("{")
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_structured_outputs_field(client, endpoint):
    constraints = [({"regex": r"[A-Z][a-z]{2,6} [0-9]{2}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", t)),
                   ({"choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
                   ({"grammar": 'root ::= "(" [a-c] ("," [a-c])? ")"'}, lambda t: re.fullmatch(r"\([a-c](,[a-c])?\)", t))]
    for constraint, check in constraints:
        body = {"structured_outputs": constraint}
        if endpoint == "chat":
            out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=1.0,
                                                 seed=3, extra_body=body)
            text = out.choices[0].message.content
        else:
            out = client.completions.create(model="tiny", prompt="Answer:", max_tokens=24, temperature=1.0,
                                            seed=3, extra_body=body)
            text = out.choices[0].text
        assert check(text), (constraint, text)


@pytest.mark.parametrize("kwargs, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     ["bogus"]),
    ({"extra_body": {"structured_outputs": {"regex": "(unclosed"}}}, ["unclosed group"]),
    ({"extra_body": {"structured_outputs": {"grammar": "start: missing_rule"}}}, ["missing_rule"]),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, ["exactly one"]),
    ({"extra_body": {"structured_outputs": {"json": "{not json"}}}, ["not valid JSON"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, ["json_schema.schema"]),
    ({"response_format": {"type": "xml"}}, ["xml"]),
    ({"response_format": {"type": "json_object"}, "extra_body": {"structured_outputs": {"regex": "a"}}},
     ["not both"]),
])
def test_bad_constraint_is_a_400(client, kwargs, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **kwargs)
    message = e.value.body["message"]
    assert all(w in message for w in words), message
    # and the server goes on serving, constraints included
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                         extra_body={"structured_outputs": {"choice": ["fine"]}})
    assert out.choices[0].message.content == "fine"
