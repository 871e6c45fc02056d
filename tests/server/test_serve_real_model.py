"""The server with the default real model (Qwen2.5-Coder-0.5B-Instruct GGUF) on the CPU."""

import json

import openai
import pytest

from server_utils import start_server

pytestmark = pytest.mark.real_models


@pytest.fixture(scope="module")
def real_client(tmp_path_factory):
    server = start_server("qwen2.5-coder-0.5b", tmp_path_factory.mktemp("real-server"),
                          "--max-model-len", "2048", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                          timeout=600)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    assert server.stop() == 0


def test_chat_answers_and_streams_the_same_text(real_client):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 2+3? Answer with one number."}]
    full = real_client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=messages,
                                               temperature=0, max_tokens=16)
    answer = full.choices[0].message.content
    assert "5" in answer and full.choices[0].finish_reason == "stop"  # EOS from the real template
    streamed = "".join(c.choices[0].delta.content or "" for c in real_client.chat.completions.create(
        model="qwen2.5-coder-0.5b", messages=messages, temperature=0, max_tokens=16, stream=True)
        if c.choices)
    assert streamed == answer


def test_code_completion(real_client):
    out = real_client.completions.create(model="qwen2.5-coder-0.5b", prompt="def fibonacci(n):",
                                         temperature=0, max_tokens=24)
    assert "return" in out.choices[0].text and out.usage.completion_tokens == 24


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


def test_tool_call_streamed_and_not(real_client):
    """The model's own call (it leaves out the <tool_call> tags) read by --tool-call-parser hermes."""
    question = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    kwargs = dict(model="qwen2.5-coder-0.5b", messages=question, tools=[WEATHER], temperature=0, max_tokens=48)
    choice = real_client.chat.completions.create(**kwargs).choices[0]
    [call] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    deltas = [c.choices[0].delta for c in real_client.chat.completions.create(stream=True, **kwargs) if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].function.name == "get_weather" and len(calls) > 2  # the arguments come as they are written
    assert "".join(c.function.arguments for c in calls) == call.function.arguments
    assert not "".join(d.content or "" for d in deltas)
