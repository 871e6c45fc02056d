"""Issue 34's agent checks on a real model: `hotpath serve` on the default model
(Qwen2.5-Coder-0.5B-Instruct, the CPU) with the hermes tool parser, driven by the official openai
client over loopback:

- 50 seeded `json_schema` requests at temperature 1.0 over five schemas (nesting, enums, arrays,
  required fields), every answer validated with jsonschema;
- `regex` and `choice` through vLLM's `structured_outputs` field;
- a tool call parsed from the model's hermes output, non-streamed and streamed, with tool_choice
  `auto`, `required` and a named function, and a second turn with the tool's result;
- bad schemas, grammars and tool schemas answered 400, the server answering on after each.

    python scripts/agent_checks.py --out docs/bench/agent/cpu_agent_checks.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import openai

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
     "required": ["name", "age", "address"], "additionalProperties": False},
    {"type": "object", "properties": {
        "language": {"enum": ["python", "rust", "go", "c"]},
        "level": {"enum": ["beginner", "intermediate", "expert"]},
        "years": {"type": "integer", "minimum": 0, "maximum": 60}},
     "required": ["language", "level", "years"], "additionalProperties": False},
    {"type": "object", "properties": {
        "tasks": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                             "done": {"type": "boolean"}},
            "required": ["title", "done"], "additionalProperties": False}}},
     "required": ["tasks"], "additionalProperties": False},
    {"type": "object", "properties": {
        "function": {"type": "string", "maxLength": 30},
        "args": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 20}},
        "returns": {"enum": ["int", "str", "list", "None"]}},
     "required": ["function", "args", "returns"], "additionalProperties": False},
    {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                  "required": ["x", "y"], "additionalProperties": False},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}},
        "note": {"type": ["string", "null"], "maxLength": 40}},
     "required": ["point", "tags", "note"], "additionalProperties": False},
]
PROMPTS = ["Describe a person as JSON.", "Describe a programmer's main language as JSON.",
           "List a few chores as JSON.", "Describe a Python function as JSON.", "Give a tagged point as JSON."]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hotpath.cli", "serve", "--port", str(port), "--tool-call-parser", "hermes",
           "--enable-auto-tool-choice", "--served-model-name", "coder"]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(900):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")


def json_schema_checks(client: openai.OpenAI, n: int) -> dict:
    def one(i: int) -> dict:
        schema = SCHEMAS[i % len(SCHEMAS)]
        r = client.chat.completions.create(
            model="coder", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            temperature=1.0, seed=i, max_tokens=256,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i % len(SCHEMAS)}", "schema": schema, "strict": True}})
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), schema)
            return {"seed": i, "valid": True, "finish_reason": r.choices[0].finish_reason}
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            return {"seed": i, "valid": False, "finish_reason": r.choices[0].finish_reason, "text": text,
                    "error": str(e)[:200]}

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(n)))
    return {"requests": n, "valid": sum(r["valid"] for r in results),
            "finish_reasons": sorted({r["finish_reason"] for r in results}),
            "invalid": [r for r in results if not r["valid"]]}


def regex_choice_checks(client: openai.OpenAI) -> dict:
    out = {}
    pattern = r"\d{3}-\d{3}-\d{4}"
    texts = [client.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "Make up a US phone number."}], temperature=1.0,
        seed=s, max_tokens=20, extra_body={"structured_outputs": {"regex": pattern}}).choices[0].message.content
        for s in range(5)]
    out["regex"] = {"pattern": pattern, "texts": texts, "all_match": all(re.fullmatch(pattern, t) for t in texts)}
    choices = ["positive", "negative", "neutral"]
    picks = [client.completions.create(
        model="coder", prompt=f"Review: {review}\nSentiment:", temperature=1.0, seed=s, max_tokens=5,
        extra_body={"structured_outputs": {"choice": choices}}).choices[0].text
        for s, review in enumerate(["Great film!", "Awful service.", "It was fine."])]
    out["choice"] = {"choices": choices, "picks": picks, "all_in": all(p in choices for p in picks)}
    return out


def tool_checks(client: openai.OpenAI) -> dict:
    out = {}
    for label, choice in (("auto", "auto"), ("required", "required"),
                          ("named", {"type": "function", "function": {"name": "get_weather"}})):
        r = client.chat.completions.create(model="coder", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                           temperature=0, max_tokens=128)
        msg = r.choices[0].message
        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in msg.tool_calls or []]
        stream = client.chat.completions.create(model="coder", messages=ASK, tools=[WEATHER, TIME],
                                                tool_choice=choice, temperature=0, max_tokens=128, stream=True)
        pieces: dict[int, dict] = {}
        content, argument_deltas = "", 0
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                p = pieces.setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function and tc.function.name:
                    p["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    p["arguments"] += tc.function.arguments
                    argument_deltas += 1
        streamed = [{"name": p["name"], "arguments": json.loads(p["arguments"])} for _, p in sorted(pieces.items())]
        out[label] = {"content": msg.content, "finish_reason": r.choices[0].finish_reason, "calls": calls,
                      "streamed_calls": streamed, "streamed_content": content,
                      "argument_deltas": argument_deltas, "streamed_equals_whole": streamed == calls}
    # the tool's result, and the model's answer from it
    r = client.chat.completions.create(model="coder", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_tokens=128)
    call = r.choices[0].message.tool_calls[0]
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    answer = client.chat.completions.create(model="coder", messages=follow, tools=[WEATHER], temperature=0,
                                            max_tokens=64)
    out["second_turn"] = {"call": call.function.arguments, "answer": answer.choices[0].message.content,
                          "finish_reason": answer.choices[0].finish_reason}
    return out


def bad_request_checks(client: openai.OpenAI, port: int) -> dict:
    bad = {
        "schema not a schema": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "no-such-type"}}}},
        "regex that does not compile": {"structured_outputs": {"regex": "(unclosed"}},
        "grammar that does not parse": {"structured_outputs": {"grammar": "root ::= ("}},
        "tool without a name": {"tools": [{"type": "function", "function": {"parameters": {}}}]},
        "tool schema not a schema": {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": 5}}}], "tool_choice": "required"},
        "named tool not among the tools": {"tools": [WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}},
    }
    out = {}
    for label, extra in bad.items():
        body = {"model": "coder", "messages": ASK, "max_tokens": 8, **extra}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
        alive = client.chat.completions.create(model="coder", messages=ASK, max_tokens=2).choices[0].finish_reason
        out[label] = {"status": r.status_code, "message": r.json().get("error", {}).get("message", "")[:200],
                      "serving_after": alive is not None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: hotpath's default model")
    ap.add_argument("--num-json", type=int, default=50)
    ap.add_argument("--out", default="agent_checks.json")
    ns = ap.parse_args()
    port = free_port()
    log = Path(ns.out).with_suffix(".server.log")
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(ns.model, port, log)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=600)
    try:
        t = time.perf_counter()
        res = {"model": ns.model or "default (qwen2.5-coder-0.5b)", "date": time.strftime("%Y-%m-%d")}
        res["json_schema"] = json_schema_checks(client, ns.num_json)
        res["regex_choice"] = regex_choice_checks(client)
        res["tools"] = tool_checks(client)
        res["bad_requests"] = bad_request_checks(client, port)
        res["wall_s"] = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    Path(ns.out).write_text(json.dumps(res, indent=1))
    js = res["json_schema"]
    print(f"json_schema: {js['valid']}/{js['requests']} valid; regex all match: {res['regex_choice']['regex']['all_match']};"
          f" choice all in: {res['regex_choice']['choice']['all_in']}")
    for label in ("auto", "required", "named"):
        t = res["tools"][label]
        print(f"tools {label}: calls {t['calls']} streamed equal: {t['streamed_equals_whole']} "
              f"({t['argument_deltas']} argument deltas), finish {t['finish_reason']}")
    print(f"second turn: {res['tools']['second_turn']['answer']!r}")
    for label, b in res["bad_requests"].items():
        print(f"bad: {label}: {b['status']} {b['message'][:80]!r} serving after: {b['serving_after']}")


if __name__ == "__main__":
    main()
