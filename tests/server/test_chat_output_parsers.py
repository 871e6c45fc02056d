"""The reasoning and tool-call parsers on hand-written model outputs: the whole message, and the same
message put together from deltas when the text arrives cut at every position (two pieces), and one
character at a time. No tool-call text in the content (vllm#22975), a call's id and name in its first
delta, arguments streamed before the call ends (vllm#30439)."""

import json

import pytest

from hotpath.server.chat_output import ChatOutputParser
from hotpath.server.reasoning import Qwen3ReasoningParser
from hotpath.server.tool_parsers import TOOL_PARSERS
from hotpath.server.tool_parsers.forced_choice import NamedFunctionParser, RequiredToolParser

TOOLS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                      "metric": {"type": "boolean"}}},
    "write_file": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                                     "options": {"type": "object"}}},
}
PREFILLED = "<|im_start|>assistant\n<think>\n"  # a template that opens the block in the prompt
NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking: false


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


# name -> (reasoning parser on, prompt tail, tool parser or None, text, reasoning, content, calls);
# "required" and "named": the JSON that tool_choice "required" / a named function constrain to
CASES = {
    "reasoning then answer": (True, "", None, "<think>\nStep one.\nStep two.\n</think>\n\nThe answer.",
                              "Step one.\nStep two.", "The answer.", []),
    "reasoning pre-filled by the template": (True, PREFILLED, None, "Step one.\n</think>\n\nThe answer.",
                                             "Step one.", "The answer.", []),
    "no reasoning block": (True, "", None, "Just <b>an</b> answer.", None, "Just <b>an</b> answer.", []),
    "thinking disabled in the prompt": (True, NO_THINKING, None, "Answer.", None, "Answer.", []),
    "cut off while reasoning": (True, PREFILLED, None, "Still thinking </thi", "Still thinking </thi", None, []),
    "whitespace before <think>": (True, "", None, " \n<think>a</think>b", "a", "b", []),
    "<think> later in the content is content": (True, "", None, "A <think>x</think>", None, "A <think>x</think>", []),
    "hermes: text, then a call": (
        False, "", "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        None, "Let me check.", [call("get_weather", city="Paris", days=3)]),
    "hermes: two calls, no text": (
        False, "", "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        None, None, [call("get_weather", city="Paris"), call("get_weather", city="Rome")]),
    "hermes: braces and escapes inside strings": (
        False, "", "hermes",
        '<tool_call>{"name": "write_file", "arguments": {"path": "a.c", "content": "if (x) { y(\\"}\\"); }\\n", '
        '"options": {"mode": [1, {"z": 2}]}}}</tool_call>',
        None, None, [call("write_file", path="a.c", content='if (x) { y("}"); }\n', options={"mode": [1, {"z": 2}]})]),
    "hermes: text after the call is kept": (
        False, "", "hermes", '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>\nDone.',
        None, "Done.", [call("get_weather")]),
    "hermes: name after arguments": (
        False, "", "hermes", '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>',
        None, None, [call("get_weather", city="Oslo")]),
    "hermes: not a call stays content": (
        False, "", "hermes", "a < b <tool_call>not json</tool_call> <tool", None,
        "a < b <tool_call>not json</tool_call> <tool", []),
    "hermes: a call without its tags (Qwen2.5-Coder-0.5B's)": (
        False, "", "hermes", '{"name": "get_weather", "arguments": {"city": "Paris", "metric": true}}', None, None,
        [call("get_weather", city="Paris", metric=True)]),
    "hermes: calls without tags, then text": (
        False, "", "hermes",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_weather", "arguments": {}}\n'
        '{"temperature": 18}', None, '{"temperature": 18}', [call("get_weather", city="Paris"), call("get_weather")]),
    "hermes: JSON that is not a call stays content": (
        False, "", "hermes", '{"name": "Bob", "age": 3} and {"answer": "' + "x" * 80 + '"}', None,
        '{"name": "Bob", "age": 3} and {"answer": "' + "x" * 80 + '"}', []),
    "hermes: a bare call of a function not among the tools stays content": (
        False, "", "hermes", '{"name": "rm_rf", "arguments": {}}', None, '{"name": "rm_rf", "arguments": {}}', []),
    "hermes: no calls": (False, "", "hermes", "Plain text, 2 < 3.\n", None, "Plain text, 2 < 3.\n", []),
    "reasoning, then a hermes call": (
        True, PREFILLED, "hermes",
        'I need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n'
        '</tool_call>', "I need the weather.", None, [call("get_weather", city="Lima")]),
    "a call inside the reasoning is reasoning": (
        True, "", "hermes", '<think><tool_call>{"name": "x", "arguments": {}}</tool_call></think>Fine.',
        '<tool_call>{"name": "x", "arguments": {}}</tool_call>', "Fine.", []),
    "qwen3_coder: typed parameters": (
        False, "", "qwen3_coder",
        "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>",
        None, "I'll look.", [call("get_weather", city='New "York"', days=3, metric=True)]),
    "qwen3_coder: a multi-line string, an object, an unknown parameter": (
        False, "", "qwen3_coder",
        "<tool_call>\n<function=write_file>\n<parameter=content>\nline 1\n\n  line 3\n\n</parameter>\n"
        "<parameter=options>\n{\"force\": true}\n</parameter>\n<parameter=extra>\n7\n</parameter>\n"
        "</function>\n</tool_call>",
        None, None, [call("write_file", content="line 1\n\n  line 3\n", options={"force": True}, extra="7")]),
    "qwen3_coder: no <tool_call>, no </parameter>": (
        False, "", "qwen3_coder",
        "<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>",
        None, None, [call("get_weather", city="Oslo", days=2)]),
    "qwen3_coder: two calls": (
        False, "", "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
        None, None, [call("get_weather", city="A"), call("get_weather")]),
    "qwen3_coder: no function stays content": (
        False, "", "qwen3_coder", "x <tool_call>\nhello\n</tool_call>", None, "x <tool_call>\nhello\n</tool_call>", []),
    "reasoning, then a qwen3_coder call": (
        True, "", "qwen3_coder",
        "<think>\nWrite it.\n</think>\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nx.md\n</parameter>\n"
        "</function>\n</tool_call>", "Write it.", None, [call("write_file", path="x.md")]),
    "required: two calls": (
        False, "", "required",
        '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}, '
        '{"name": "write_file", "parameters": {"path": "a.md", "content": "}, ]\\" {\\"name"}}]',
        None, None, [call("get_weather", city="Paris", days=2), call("write_file", path="a.md", content='}, ]" {"name')]),
    "a named function": (False, "", "named", '{"city": "Paris", "days": 1}', None, None,
                         [call("get_weather", city="Paris", days=1)]),
}


def tool_parser(name):
    if name == "required":
        return RequiredToolParser(TOOLS)
    if name == "named":
        return NamedFunctionParser(TOOLS, "get_weather")
    return TOOL_PARSERS[name](TOOLS)


def make_parser(reasoning, tail, tools):
    return ChatOutputParser(Qwen3ReasoningParser(tail) if reasoning else None, tool_parser(tools) if tools else None)


def assemble(deltas):
    """A message from streamed ChatDeltas, checking the shape of each call's deltas on the way."""
    reasoning, content, calls = "", "", {}
    for d in deltas:
        reasoning += d.reasoning
        content += d.content
        for c in d.tool_calls:
            if c.index not in calls:
                assert c.id and c.id.startswith("call_") and c.name, c  # id and name come first
                assert c.index == len(calls)
                calls[c.index] = {"name": c.name, "arguments": ""}
            else:
                assert c.id is None and c.name is None, c
            calls[c.index]["arguments"] += c.arguments
    return reasoning, content, [calls[i] for i in sorted(calls)]


def stream(parser, pieces):
    deltas = [parser.feed(p) for p in pieces]
    return deltas + [parser.finish()]


def splits(text):
    yield "one piece", [text]
    yield "characters", list(text)
    for i in range(1, len(text)):
        yield f"cut at {i}", [text[:i], text[i:]]


@pytest.mark.parametrize("name", list(CASES))
def test_whole_message(name):
    reasoning_on, tail, tools, text, reasoning, content, calls = CASES[name]
    parser = make_parser(reasoning_on, tail, tools)
    message = parser.message(text)
    assert message["content"] == content
    assert message.get("reasoning_content") == reasoning
    got = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
           for c in message.get("tool_calls", [])]
    assert got == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message.get("tool_calls", []))
    assert parser.tools_called == bool(calls)


@pytest.mark.parametrize("name", list(CASES))
def test_streamed_equals_whole_at_every_cut(name):
    reasoning_on, tail, tools, text, _, _, calls = CASES[name]
    whole = make_parser(reasoning_on, tail, tools).message(text)
    want = (whole.get("reasoning_content") or "", whole["content"] or "",
            [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in whole.get("tool_calls", [])])
    for how, pieces in splits(text):
        deltas = stream(make_parser(reasoning_on, tail, tools), pieces)
        assert assemble(deltas) == want, how
        if calls:  # vllm#22975: no part of a call in the content
            for d in deltas:
                assert "<tool_call" not in d.content and "<function" not in d.content, (how, d)


@pytest.mark.parametrize("tools, text, end_tag", [
    ("hermes", '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": "' + "x" * 40 + '"}}</tool_call>',
     "</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=write_file>\n<parameter=content>\n" + "x" * 40 +
     "\n</parameter>\n</function>\n</tool_call>", "</parameter>"),
])
def test_arguments_stream_as_they_come(tools, text, end_tag):
    """vllm#30439: the arguments arrive with the text, not all at the call's end."""
    parser = make_parser(False, "", tools)
    arrived = []  # characters fed when each arguments delta came out
    for i, ch in enumerate(text):
        for c in parser.feed(ch).tool_calls:
            if c.arguments:
                arrived.append(i)
    assert len(arrived) > 20
    assert arrived[20] < text.index(end_tag)

