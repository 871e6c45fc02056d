import pytest

from hotpath.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.seed) == (16, 0, None, None)
    assert (p.ignore_eos, p.skip_special_tokens) == (False, True)
    assert p.include_stop_str_in_output is False
    assert p.stop == [] and p.stop_token_ids == []
    assert not p.greedy


def test_normalization():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(max_tokens=None).max_tokens is None


@pytest.mark.parametrize(
    "temperature, greedy", [(0.0, True), (1e-6, True), (1e-5, False), (0.7, False)]
)
def test_greedy(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


@pytest.mark.parametrize(
    "name, value",
    [
        ("n", 0),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_k", -2),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("presence_penalty", 2.1),
        ("presence_penalty", -2.1),
        ("frequency_penalty", 2.1),
        ("frequency_penalty", -2.1),
        ("repetition_penalty", 0.0),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("min_tokens", 17),  # above the default max_tokens of 16
        ("logprobs", -1),
        ("logprobs", 21),
        ("stop", ""),
        ("stop", ["ok", ""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_invalid_value_raises_naming_the_parameter(name, value):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{name: value})
    message = str(info.value)
    assert message.startswith(name + " ")
    assert repr(value) in message or repr([value]) in message


@pytest.mark.parametrize(
    "name, value",
    [
        ("top_p", 1.0),
        ("top_k", 1),
        ("min_p", 1.0),
        ("presence_penalty", -2.0),
        ("frequency_penalty", 2.0),
        ("logprobs", 0),
        ("logprobs", 20),
        ("min_tokens", 16),
        ("max_tokens", 1),
    ],
)
def test_boundary_values_accepted(name, value):
    assert getattr(SamplingParams(**{name: value}), name) == value


def test_structured_outputs_one_constraint():
    from hotpath.sampling_params import StructuredOutputsParams

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = SamplingParams(structured_outputs={"json": schema})
    assert p.structured_outputs == StructuredOutputsParams(json=schema)
    assert p.structured_outputs.kind == "json"
    # a schema as text or as a dict, however spaced, gives one cache key
    assert StructuredOutputsParams(json='{"type":"object",  "properties": {"a": {"type": "integer"}}}').spec \
        == p.structured_outputs.spec
    assert StructuredOutputsParams(choice=("yes", "no")).choice == ["yes", "no"]
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    assert StructuredOutputsParams(regex="[a-z]+").spec == "[a-z]+"


@pytest.mark.parametrize("fields, message", [
    ({}, "exactly one"),
    ({"json": {"type": "object"}, "regex": "a"}, "exactly one"),
    ({"json_object": False}, "exactly one"),
    ({"json": "{"}, "not valid JSON"),
    ({"json": "[1]"}, "JSON schema object"),
    ({"regex": ""}, "non-empty string"),
    ({"grammar": 3}, "non-empty string"),
    ({"choice": []}, "non-empty list"),
    ({"choice": "yes"}, "non-empty list"),
    ({"choice": ["yes", ""]}, "non-empty strings"),
    ({"json_object": 1}, "must be a bool"),
    ({"jsn": {}}, "no field 'jsn'"),
])
def test_structured_outputs_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(structured_outputs=fields)


def test_structured_outputs_wrong_type():
    with pytest.raises(ValueError, match="StructuredOutputsParams or a dict"):
        SamplingParams(structured_outputs="json")
