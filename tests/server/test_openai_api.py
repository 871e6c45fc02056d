"""The server through the official openai client: completions and chat, streaming and not, stop
strings, n > 1, logprobs, usage; streamed text equals non-streamed text for greedy requests."""

import httpx
import openai
import pytest

from server_utils import API_KEY

GREEDY = dict(temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Now count to three."},
]


def stream_completion(client, **kwargs):
    texts, finish, usage = {}, {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, usage


def stream_chat(client, **kwargs):
    texts, finish, roles, usage, logprobs = {}, {}, {}, None, {}
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.logprobs is not None:
                logprobs.setdefault(c.index, []).extend(c.logprobs.content)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, roles, usage, logprobs


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


@pytest.mark.parametrize("prompt", ["Hello, world!", "def add(a, b):", "The quick brown fox"])
def test_completion_stream_equals_non_stream(client, prompt):
    full = client.completions.create(model="tiny", prompt=prompt, **GREEDY)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.completion_tokens == 24
    assert full.usage.total_tokens == full.usage.prompt_tokens + 24
    texts, finish, usage = stream_completion(client, model="tiny", prompt=prompt, **GREEDY)
    assert texts[0] == choice.text
    assert finish[0] == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (full.usage.prompt_tokens, 24)


def test_chat_multi_turn_stream_equals_non_stream(client):
    full = client.chat.completions.create(model="tiny", messages=CONVERSATION, **GREEDY)
    msg = full.choices[0].message
    assert msg.role == "assistant" and full.choices[0].finish_reason == "length"
    texts, finish, roles, usage, _ = stream_chat(client, model="tiny", messages=CONVERSATION, **GREEDY)
    assert texts[0] == msg.content and roles[0] == "assistant" and finish[0] == "length"
    assert usage.prompt_tokens == full.usage.prompt_tokens and usage.completion_tokens == 24
    # the chat template was applied: the prompt is longer than the messages' text alone
    plain = client.completions.create(model="tiny", prompt="Now count to three.", max_tokens=1)
    assert full.usage.prompt_tokens > plain.usage.prompt_tokens + 10


def test_max_completion_tokens(client):
    out = client.chat.completions.create(model="tiny", messages=CONVERSATION, temperature=0,
                                         max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def _stop_string(text: str) -> str:
    """Two printable characters from the middle of text, to use as a stop string."""
    for i in range(4, len(text) - 2):
        cand = text[i:i + 2]
        if cand.isascii() and cand.isprintable():
            return cand
    pytest.skip(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_stop_string(client, endpoint):
    if endpoint == "completions":
        kwargs = dict(model="tiny", prompt="Hello, world!", temperature=0, max_tokens=24)
        text = client.completions.create(**kwargs).choices[0].text
    else:
        kwargs = dict(model="tiny", messages=CONVERSATION, temperature=0, max_tokens=24)
        text = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = _stop_string(text)
    expected = text[:text.index(stop)]
    if endpoint == "completions":
        out = client.completions.create(stop=[stop], **kwargs).choices[0]
        got, reason = out.text, out.finish_reason
        texts, finish, _ = stream_completion(client, stop=stop, **kwargs)
    else:
        out = client.chat.completions.create(stop=[stop], **kwargs).choices[0]
        got, reason = out.message.content, out.finish_reason
        texts, finish, *_ = stream_chat(client, stop=stop, **kwargs)
    assert (got, reason) == (expected, "stop")
    assert (texts[0], finish[0]) == (expected, "stop")


def test_n_choices_seeded(client):
    kwargs = dict(model="tiny", prompt="Hello", temperature=1.0, seed=1234, n=3, max_tokens=12,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    assert sorted(c.index for c in full.choices) == [0, 1, 2]
    assert full.usage.completion_tokens == 36
    texts = {c.index: c.text for c in full.choices}
    assert len(set(texts.values())) > 1  # sampled, so the choices differ
    streamed, finish, usage = stream_completion(client, **kwargs)
    assert streamed == texts and usage.completion_tokens == 36
    assert finish == {0: "length", 1: "length", 2: "length"}


def test_n_chat_streaming(client):
    texts, finish, roles, usage, _ = stream_chat(client, model="tiny", messages=CONVERSATION, n=2,
                                                 temperature=0.8, seed=5, max_tokens=8,
                                                 extra_body={"ignore_eos": True})
    assert sorted(texts) == [0, 1] and roles == {0: "assistant", 1: "assistant"}
    assert usage.completion_tokens == 16 and finish == {0: "length", 1: "length"}


def test_completion_logprobs(client):
    kwargs = dict(model="tiny", prompt="The quick", logprobs=3, **GREEDY)
    full = client.completions.create(**kwargs).choices[0]
    lp = full.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 24
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3  # byte pieces may decode to the same text and collapse
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the most likely
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = []
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            if c.logprobs:
                streamed.extend(c.logprobs.token_logprobs)
    assert streamed == pytest.approx(lp.token_logprobs)


def test_chat_logprobs(client):
    kwargs = dict(model="tiny", messages=CONVERSATION, logprobs=True, top_logprobs=2, **GREEDY)
    full = client.chat.completions.create(**kwargs).choices[0]
    content = full.logprobs.content
    assert len(content) == 24
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
    *_, streamed = stream_chat(client, **kwargs)
    assert [e.logprob for e in streamed[0]] == pytest.approx([e.logprob for e in content])


def test_no_logprobs_by_default(client):
    out = client.chat.completions.create(model="tiny", messages=CONVERSATION, max_tokens=2)
    assert out.choices[0].logprobs is None


def test_token_id_prompt_and_tokenize_round_trip(server, client):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "Hello, world!"}, headers=headers).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 512
    detok = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, headers=headers).json()
    assert detok["prompt"] == "Hello, world!"
    by_text = client.completions.create(model="tiny", prompt="Hello, world!", **GREEDY).choices[0].text
    by_ids = client.completions.create(model="tiny", prompt=tok["tokens"], **GREEDY).choices[0].text
    assert by_ids == by_text
    chat = httpx.post(server.url + "/tokenize", json={"messages": CONVERSATION}, headers=headers).json()
    full = client.chat.completions.create(model="tiny", messages=CONVERSATION, max_tokens=1)
    assert chat["count"] == full.usage.prompt_tokens


def test_batch_of_prompts(client):
    prompts = ["Hello", "def add(a, b):"]
    full = client.completions.create(model="tiny", prompt=prompts, n=2, **GREEDY)
    assert sorted(c.index for c in full.choices) == [0, 1, 2, 3]
    singles = [client.completions.create(model="tiny", prompt=p, **GREEDY).choices[0].text for p in prompts]
    by_index = {c.index: c.text for c in full.choices}
    assert [by_index[0], by_index[1], by_index[2], by_index[3]] == [singles[0]] * 2 + [singles[1]] * 2
    texts, _, usage = stream_completion(client, model="tiny", prompt=prompts, n=2, **GREEDY)
    assert texts == by_index and usage.completion_tokens == 4 * 24


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(server.url + "/health").status_code == 200
    resp = httpx.get(server.url + "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_hits_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_sum", "vllm:request_success_total",
                 "hotpath:http_requests_total"):
        assert f"\n{name}" in resp.text, name


def test_sampling_fields_reach_the_engine(client, tiny_chat_model):
    """Every sampling field the server takes gives the offline API's output for the same params."""
    from hotpath import LLM, SamplingParams

    fields = dict(temperature=0.7, top_p=0.9, seed=3, presence_penalty=0.5, frequency_penalty=1.5)
    extra = dict(top_k=5, min_p=0.05, repetition_penalty=1.2, ignore_eos=True)
    out = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=16,
                                    extra_body=extra, **fields)
    llm = LLM(str(tiny_chat_model), device="cpu", dtype="float32")
    offline = llm.generate("The quick brown fox", SamplingParams(max_tokens=16, **fields, **extra),
                           use_tqdm=False)
    assert out.choices[0].text == offline[0].outputs[0].text
    plain = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=16,
                                      seed=3, temperature=0.7, extra_body={"ignore_eos": True})
    assert plain.choices[0].text != out.choices[0].text  # the penalties and filters changed something
