"""Bad input gets the right status and an OpenAI error body, and the server keeps serving."""

import httpx
import openai
import pytest

from server_utils import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2}

# (name, path, body: dict or raw bytes, status, param, code, words the message must contain)
CASES = [
    ("malformed json", "/v1/chat/completions", b'{"messages": [', 400, None, None, ["JSON"]),
    ("body not an object", "/v1/completions", b"[1, 2]", 400, None, None, ["object"]),
    ("unknown model", "/v1/chat/completions", {**CHAT, "model": "gpt-4"}, 404, "model", "model_not_found", ["gpt-4"]),
    ("missing messages", "/v1/chat/completions", {"model": "tiny"}, 400, "messages", None, ["messages"]),
    ("empty messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", None, []),
    ("bad role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
     400, "messages.0.role", None, []),
    ("temperature not a number", "/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature", None, []),
    ("negative temperature", "/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature", None, [">= 0"]),
    ("top_p zero", "/v1/completions", {**COMPLETION, "top_p": 0}, 400, "top_p", None, []),
    ("top_k negative", "/v1/completions", {**COMPLETION, "top_k": -5}, 400, "top_k", None, []),
    ("max_tokens zero", "/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", None, []),
    ("n zero", "/v1/completions", {**COMPLETION, "n": 0}, 400, "n", None, []),
    ("n too large", "/v1/completions", {**COMPLETION, "n": 1000}, 400, "n", None, ["128"]),
    ("presence penalty", "/v1/chat/completions", {**CHAT, "presence_penalty": 3}, 400, "presence_penalty", None, []),
    ("too many logprobs", "/v1/completions", {**COMPLETION, "logprobs": 50}, 400, "logprobs", None,
     ["logprobs", "20", "50"]),
    # the chat API's count is top_logprobs (its logprobs is a bool): the error names the field sent
    ("too many top_logprobs", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 50},
     400, "top_logprobs", None, ["top_logprobs", "20", "50"]),
    ("negative top_logprobs", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": -1},
     400, "top_logprobs", None, ["top_logprobs", "20"]),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", None, []),
    ("empty prompt", "/v1/completions", {**COMPLETION, "prompt": ""}, 400, "prompt", None, ["empty"]),
    ("token id out of vocab", "/v1/completions", {**COMPLETION, "prompt": [1, 2, 10**6]}, 400, "prompt", None, ["1000000"]),
    ("prompt over the context limit", "/v1/completions", {**COMPLETION, "prompt": [5] * 600},
     400, "prompt", "context_length_exceeded", ["512", "600"]),
    ("prompt + max_tokens over the limit", "/v1/completions", {**COMPLETION, "prompt": [5] * 300, "max_tokens": 300},
     400, "max_tokens", "context_length_exceeded", ["512", "600", "300"]),
    ("stream not a bool", "/v1/completions", {**COMPLETION, "stream": "maybe"}, 400, "stream", None, []),
    ("tool without its function", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400,
     "tools.0.function", None, []),
    # a server started without --enable-auto-tool-choice: tools default to "auto"
    ("tool_choice auto without the flag", "/v1/chat/completions",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice", None,
     ["--enable-auto-tool-choice", "--tool-call-parser"]),
    ("tool_choice without tools", "/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400,
     "tool_choice", None, ["tools"]),
    ("content part of an unknown type", "/v1/chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, 400,
     "messages.0.content", None, ["'input_audio'", "not supported", "text"]),
    # fields hotpath does not implement, which would change the output: refused, not ignored
    *[(f"unsupported field {name}", path, {**body, name: value}, 400, name, None, [name])
      for name, value, path, body in [
          ("logit_bias", {"42": 100}, "/v1/chat/completions", CHAT),
          ("guided_json", {"type": "object"}, "/v1/chat/completions", CHAT),
          ("reasoning_effort", "high", "/v1/chat/completions", CHAT),
          ("use_beam_search", True, "/v1/completions", COMPLETION),
          ("prompt_logprobs", 1, "/v1/completions", COMPLETION),
      ]],
    ("body over the size limit", "/v1/completions", {**COMPLETION, "prompt": "x" * 70000}, 413, None,
     "request_too_large", ["65536"]),
]


def check_error(resp: httpx.Response, status: int, param=None, code=None, words=()):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param
    assert body["error"]["code"] == code
    for word in words:
        assert word in body["error"]["message"], body
    return body["error"]


def assert_still_serving(server):
    resp = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=60)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("name, path, body, status, param, code, words", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, name, path, body, status, param, code, words):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    resp = httpx.post(server.url + path, headers=HEADERS, timeout=60, **kwargs)
    check_error(resp, status, param, code, words)
    assert_still_serving(server)


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {**CHAT, "parallel_tool_calls": True}),
                                        ("/v1/completions", COMPLETION)])
def test_harmless_fields_pass(server, path, body):
    harmless = {"user": "u-1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
                "prompt_cache_key": "k", "safety_identifier": "s"}
    resp = httpx.post(server.url + path, json={**body, **harmless}, headers=HEADERS, timeout=60)
    assert resp.status_code == 200, resp.text


def test_tool_choice_none_needs_no_flag(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    resp = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": "none"},
                      headers=HEADERS, timeout=60)
    assert resp.status_code == 200 and "tool_calls" not in resp.json()["choices"][0]["message"], resp.text


def test_chunked_body_over_the_limit(server):
    def chunks():
        for _ in range(20):
            yield b"x" * 8192  # no Content-Length: the limit is enforced while reading

    resp = httpx.post(server.url + "/v1/completions", content=chunks(), headers=HEADERS, timeout=60)
    check_error(resp, 413, code="request_too_large")
    assert_still_serving(server)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}],
                         ids=["missing", "wrong", "no bearer"])
def test_api_key(server, headers):
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/tokenize")):
        resp = httpx.request(method, server.url + path, json=CHAT, headers=headers, timeout=60)
        check_error(resp, 401, code="invalid_api_key")
    assert_still_serving(server)


def test_unknown_route_and_method(server):
    check_error(httpx.get(server.url + "/v1/nope", headers=HEADERS), 404, code="not_found")
    check_error(httpx.get(server.url + "/v1/completions", headers=HEADERS), 405)
    assert_still_serving(server)


def test_openai_client_errors(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=CHAT["messages"])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[5] * 600)
    assert e.value.code == "context_length_exceeded" and "512" in e.value.message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError):  # a stream is refused before it starts
        client.chat.completions.create(model="tiny", messages=CHAT["messages"], temperature=-1, stream=True)
    assert client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=2).choices
