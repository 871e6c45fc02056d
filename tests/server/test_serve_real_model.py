"""The server with the default real model (Qwen2.5-Coder-0.5B-Instruct GGUF) on the CPU."""

import openai
import pytest

from server_utils import start_server

pytestmark = pytest.mark.real_models


@pytest.fixture(scope="module")
def real_client(tmp_path_factory):
    server = start_server("qwen2.5-coder-0.5b", tmp_path_factory.mktemp("real-server"),
                          "--max-model-len", "2048", timeout=600)
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
