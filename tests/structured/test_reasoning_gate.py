"""A constraint that waits for the reasoning block (hotpath/structured/reasoning.py), through
LLM.chat on the tiny agent checkpoint: it reasons, closes the block, then answers. Its template
pre-fills <think> (the reply starts in the block) or, with thinking off, writes a closed block (the
reply starts undecided; its tags are two tokens each, so it answers at once)."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.sampling_params import StructuredOutputsParams
from tiny_agent_model import REASONING, make_tiny_agent_model

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
YES_NO = SamplingParams(temperature=0, max_tokens=32, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(make_tiny_agent_model(tmp_path_factory.mktemp("tiny-agent")))


@pytest.fixture(scope="module")
def llm(model):
    return LLM(model, device="cpu", reasoning_parser="qwen3", async_scheduling=True)


def test_the_grammar_starts_after_the_reasoning_block(llm):
    text = llm.chat(QUESTION, YES_NO, use_tqdm=False)[0].outputs[0].text
    block = "".join(REASONING) + "</think>"
    assert text.startswith(block) and text[len(block):] in ("yes", "no"), text


def test_a_closed_block_in_the_prompt_constrains_from_the_first_token(llm):
    out = llm.chat(QUESTION, YES_NO, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    assert out[0].outputs[0].text in ("yes", "no")


def test_without_a_reasoning_parser_the_grammar_holds_from_the_first_token(model):
    text = LLM(model, device="cpu").chat(QUESTION, YES_NO, use_tqdm=False)[0].outputs[0].text
    assert text in ("yes", "no")


def test_an_undecided_reply_may_open_the_block_where_its_tag_is_one_token(llm):
    """The mask of an undecided row is the grammar's and the opening tag's token."""
    structured = llm.engine.structured
    gate = structured.reasoning
    seqs_before = len(llm.engine.requests)
    llm.engine.add_request("undecided", {"prompt_token_ids": [5, 6, 7]}, YES_NO)  # no <think> at the end
    seq = llm.engine.requests["undecided"].seqs[0]
    while not seq.grammar.ready:
        structured.poll()
    assert seq.grammar.phase == "undecided"
    plain = structured.mask([seq]).bitmask[0].clone()
    gate.start_id = 37  # as if <think> were token 37 (one not in the grammar's first mask)
    try:
        assert not plain[37 // 32] & (1 << 37 % 32)
        opened = structured.mask([seq]).bitmask[0]
        assert opened[37 // 32] & (1 << 37 % 32)
        plain[37 // 32] |= 1 << 37 % 32
        assert torch.equal(opened, plain)
    finally:
        gate.start_id = None
        llm.engine.abort_request("undecided")
    assert len(llm.engine.requests) == seqs_before


def test_an_unknown_reasoning_parser_is_a_value_error(model):
    with pytest.raises(ValueError, match="reasoning_parser must be one of qwen3"):
        LLM(model, device="cpu", reasoning_parser="deepseek")
