"""`hotpath serve --speculative-config ...` driven by the official openai client: greedy output
equals the offline engine's without speculation, streamed deltas (several tokens a step) add up
to it, and /metrics counts the drafts."""

import json

import pytest
from server_utils import start_server

from hotpath import LLM, SamplingParams

# repeated text, so the n-gram lookup finds drafts in the prompt
PROMPT = "one two three four five six seven eight nine ten " * 3
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def spec_server(tiny_chat_model, tmp_path_factory):
    srv = start_server(tiny_chat_model, tmp_path_factory.mktemp("spec-server"),
                       "--speculative-config", json.dumps(SPEC), "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_speculative_serve_matches_offline(spec_server, tiny_chat_model):
    import openai

    llm = LLM(str(tiny_chat_model), device="cpu", dtype="float32")
    want = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == want
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == want
    metrics = {k.split("{")[0]: v for k, v in spec_server.metrics().items()}
    drafted = metrics["vllm:spec_decode_num_draft_tokens_total"]
    accepted = metrics["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted > 0 and 0 < accepted <= drafted
    per_pos = [v for k, v in spec_server.metrics().items()
               if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
    assert len(per_pos) == SPEC["num_speculative_tokens"] and sum(per_pos) == accepted


def test_bad_speculative_config_is_a_clear_error(tiny_chat_model, tmp_path):
    with pytest.raises(Exception, match="num_speculative_tokens"):
        start_server(tiny_chat_model, tmp_path, "--speculative-config",
                     json.dumps({"method": "ngram", "num_speculative_tokens": 0}), timeout=60)
