"""LLM.chat(tools=...): the tools rendered by the model's own chat template, as vLLM's LLM.chat
renders them; the reply is the model's raw text, its tool call included."""

import pytest

from hotpath import LLM, SamplingParams
from tiny_agent_model import REPLY, TOOL, make_tiny_agent_model

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(str(make_tiny_agent_model(tmp_path_factory.mktemp("tiny-agent"))), device="cpu")


def test_chat_renders_the_tools_and_the_reply_calls_one(llm):
    greedy = SamplingParams(temperature=0, max_tokens=64)
    with_tools, = llm.chat(QUESTION, greedy, use_tqdm=False, tools=[TOOL])
    without, = llm.chat(QUESTION, greedy, use_tqdm=False)
    tok = llm.engine.tokenizer
    prompt = tok.decode(with_tools.prompt_token_ids)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert "<tools>" not in tok.decode(without.prompt_token_ids)
    # the same prompt the template gives transformers' own apply_chat_template
    expected = tok.apply_chat_template(QUESTION, tools=[TOOL], add_generation_prompt=True, tokenize=True)
    assert with_tools.prompt_token_ids == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert with_tools.outputs[0].text == "".join(REPLY)


@pytest.mark.parametrize("tools, named", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools[0]"),
    ([TOOL, {"name": "get_weather"}], "tools[1]"),
])
def test_malformed_tools_are_a_value_error_naming_the_tool(llm, tools, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        llm.chat(QUESTION, tools=tools, use_tqdm=False)
