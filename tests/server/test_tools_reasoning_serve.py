"""Reasoning and tool calls end to end: `hotpath serve --reasoning-parser qwen3 --tool-call-parser
hermes --enable-auto-tool-choice` on a tiny checkpoint scripted to reason and call a tool
(tests/tiny_agent_model.py), through the official openai client; streamed and not, a tool result
sent back, tool_choice none, thinking turned off through chat_template_kwargs."""

import json

import httpx
import openai
import pytest

from server_utils import start_server
from tiny_agent_model import CALL_ARGUMENTS, LINE, REASONING, REPLY, TOOL

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGUMENTS = json.loads("".join(CALL_ARGUMENTS))
RAW_REPLY = "".join(REPLY)


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory):
    from tiny_agent_model import make_tiny_agent_model

    model = make_tiny_agent_model(tmp_path_factory.mktemp("tiny-agent"))
    # the parsers run in the HTTP process: the engine's own process would only add start-up time
    srv = start_server(model, tmp_path_factory.mktemp("agent-server"), "--served-model-name", "agent",
                       "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                       "--enable-auto-tool-choice", "--no-engine-process")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture
def agent(agent_server):
    return openai.OpenAI(base_url=agent_server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def ask(client, messages=QUESTION, **kwargs):
    return client.chat.completions.create(model="agent", messages=messages, temperature=0, max_tokens=64, **kwargs)


def stream(client, messages=QUESTION, **kwargs):
    """(reasoning, content, calls by index, finish_reason, the content deltas) of a streamed reply."""
    reasoning, content, calls, finish, content_deltas = "", "", {}, None, []
    for chunk in client.chat.completions.create(model="agent", messages=messages, temperature=0, max_tokens=64,
                                                stream=True, **kwargs):
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        if delta.content:
            content += delta.content
            content_deltas.append(delta.content)
        for c in delta.tool_calls or ():
            if c.index not in calls:  # the call's first delta: its id, type and name
                assert c.id.startswith("call_") and c.type == "function" and c.function.name, c
                calls[c.index] = {"id": c.id, "name": c.function.name, "arguments": ""}
            else:
                assert c.id is None and c.function.name is None, c
            calls[c.index]["arguments"] += c.function.arguments or ""
        finish = choice.finish_reason or finish
    return reasoning, content, calls, finish, content_deltas


def test_reasoning_and_tool_call(agent):
    reply = ask(agent, tools=[TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    message = choice.message
    assert message.reasoning_content == "".join(REASONING)  # the template pre-filled <think>
    assert message.content == LINE  # the text beside the call is kept, the call's is not
    [call] = message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS


def test_streamed_reply_equals_the_whole_one(agent):
    whole = ask(agent, tools=[TOOL]).choices[0].message
    reasoning, content, calls, finish, content_deltas = stream(agent, tools=[TOOL])
    assert (reasoning, content, finish) == (whole.reasoning_content, whole.content, "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls]
    # vllm#22975: the tags reach the server split over two tokens; none of the call is content
    assert not any("<" in d or "{" in d for d in content_deltas), content_deltas


def test_tool_choice_none_and_no_tools_leave_the_text(agent):
    for kwargs in ({"tools": [TOOL], "tool_choice": "none"}, {}):
        choice = ask(agent, **kwargs).choices[0]
        assert choice.finish_reason == "stop" and not choice.message.tool_calls
        assert choice.message.reasoning_content == "".join(REASONING)
        assert choice.message.content == RAW_REPLY.split("</think>\n\n")[1]
        reasoning, content, calls, finish, _ = stream(agent, **kwargs)
        assert (reasoning, content, calls, finish) == (choice.message.reasoning_content, choice.message.content,
                                                       {}, "stop")


def test_thinking_off_through_chat_template_kwargs(agent):
    kwargs = {"tools": [TOOL], "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    message = ask(agent, **kwargs).choices[0].message
    assert message.reasoning_content is None and message.content == LINE
    assert json.loads(message.tool_calls[0].function.arguments) == ARGUMENTS
    reasoning, content, calls, finish, _ = stream(agent, **kwargs)
    assert (reasoning, content, len(calls), finish) == ("", LINE, 1, "tool_calls")


def test_tool_result_round_trips(agent, agent_server):
    first = ask(agent, tools=[TOOL]).choices[0].message
    call = first.tool_calls[0]
    conversation = [*QUESTION, first.model_dump(exclude_none=True),  # the reply sent back as it came
                    {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sun", "high": 24}'}]
    second = ask(agent, conversation, tools=[TOOL])
    assert second.choices[0].message.tool_calls  # the scripted model calls again, whatever it is told
    # the template rendered the earlier turn's reasoning, call and the tool's result
    tokens = httpx.post(agent_server.url + "/tokenize", json={"messages": conversation, "tools": [TOOL]},
                        timeout=60).json()["tokens"]
    prompt = httpx.post(agent_server.url + "/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]
    assert f"<think>\n{''.join(REASONING)}\n</think>\n\n{LINE}" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"forecast": "sun", "high": 24}\n</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")


# one whose arguments the schema alone decides: the scripted model's own text is nothing like them
UNIT_TOOL = {"type": "function", "function": {"name": "set_unit", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("tool_choice, parallel", [
    ("required", False), ({"type": "function", "function": {"name": "set_unit"}}, True)])
def test_required_and_named_calls_follow_the_schema(agent, tool_choice, parallel):
    kwargs = {"tools": [TOOL, UNIT_TOOL] if isinstance(tool_choice, dict) else [UNIT_TOOL],
              "tool_choice": tool_choice, "parallel_tool_calls": parallel}
    choice = ask(agent, **kwargs).choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "set_unit" and json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
    # OpenAI's finish reasons: "tool_calls" for required, "stop" for a named function
    finish_reason = "stop" if isinstance(tool_choice, dict) else "tool_calls"
    # the model reasons first (the template pre-filled <think>), the schema holds after </think>
    assert choice.message.reasoning_content == "".join(REASONING)
    assert choice.message.content is None and choice.finish_reason == finish_reason
    reasoning, content, calls, finish, _ = stream(agent, **kwargs)
    assert (reasoning, content, finish) == ("".join(REASONING), "", finish_reason)
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [("set_unit", call.function.arguments)]


def test_a_constrained_reply_reasons_first_then_follows_its_grammar(agent):
    """With --reasoning-parser the engine holds the grammar back until the reasoning block ends; a
    prompt whose block is closed already (thinking off) is constrained from its first token."""
    kwargs = {"extra_body": {"structured_outputs": {"choice": ["yes", "no"]}}}
    message = ask(agent, **kwargs).choices[0].message
    assert message.content in ("yes", "no") and message.reasoning_content == "".join(REASONING)
    assert stream(agent, **kwargs)[:3] == ("".join(REASONING), message.content, {})
    off = {"extra_body": {**kwargs["extra_body"], "chat_template_kwargs": {"enable_thinking": False}}}
    message = ask(agent, **off).choices[0].message
    assert message.content in ("yes", "no") and message.reasoning_content is None


@pytest.mark.parametrize("body, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, ["'nope'", "get_weather"]),
    ({"tool_choice": "sometimes"}, ["tool_choice must be"]),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, ["tools.0.function.name"]),
    ({"messages": [*QUESTION, {"role": "tool", "content": "21"}]}, ["tool_call_id"]),
    ({"messages": [*QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]}]},
     ["messages.1.tool_calls.0.function.arguments", "not valid JSON"]),
    ({"chat_template_kwargs": {"tokenize": False}}, ["tokenize"]),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}}]},
     ["tool_choice \"required\"", "parameters schemas", "nonsense"]),
])
def test_bad_tool_requests_are_400(agent, body, words):
    body = {"messages": QUESTION, "tools": [TOOL], **body}
    extra = {k: body.pop(k) for k in list(body) if k not in ("messages", "tools", "tool_choice")}
    with pytest.raises(openai.BadRequestError) as raised:
        agent.chat.completions.create(model="agent", extra_body=extra, **body)
    for word in words:
        assert word in raised.value.body["message"], raised.value.body
    assert ask(agent, tools=[TOOL]).choices[0].finish_reason == "tool_calls"  # still serving
