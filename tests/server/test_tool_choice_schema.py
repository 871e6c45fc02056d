"""The schemas that tool_choice "required" and a named function constrain the output to (as vLLM
builds them): what they accept, their $defs, and that the grammar library takes them."""

import jsonschema
import pytest

from hotpath.sampling_params import StructuredOutputsParams
from hotpath.server.tool_parsers.forced_choice import function_schema, required_schema
from hotpath.structured.backend import grammar_text

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city"]}
ROUTE = {"type": "object", "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/place"}}},
         "$defs": {"place": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
TOOLS = {"get_weather": WEATHER, "plan_route": ROUTE, "ping": None}


def test_required_accepts_calls_of_the_tools_only():
    schema = required_schema(TOOLS)
    assert "$defs" not in schema["items"]["anyOf"][1]["properties"]["parameters"]
    assert schema["$defs"] == ROUTE["$defs"]  # where the tool's #/$defs/place now points
    ok = [{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}},
          {"name": "plan_route", "parameters": {"stops": [{"name": "A"}, {"name": "B"}]}},
          {"name": "ping", "parameters": {}}]
    jsonschema.validate(ok, schema)
    for bad in ([], [{"name": "get_weather", "parameters": {"unit": "c"}}],
                [{"name": "nope", "parameters": {}}], [{"name": "plan_route", "parameters": {"stops": [{}]}}],
                [{"name": "ping", "parameters": {}, "extra": 1}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_required_without_parallel_calls_takes_one():
    schema = required_schema(TOOLS, parallel=False)
    jsonschema.validate([{"name": "ping", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "ping", "parameters": {}}] * 2, schema)


def test_conflicting_defs_are_refused():
    other = {**ROUTE, "$defs": {"place": {"type": "string"}}}
    with pytest.raises(ValueError, match=r"\$defs.place"):
        required_schema({"plan_route": ROUTE, "other": other})


def test_named_function_is_its_parameters():
    assert function_schema(WEATHER) is WEATHER
    jsonschema.validate({}, function_schema(None))


@pytest.mark.parametrize("schema", [required_schema(TOOLS), required_schema(TOOLS, parallel=False),
                                    function_schema(WEATHER), function_schema(None)])
def test_the_grammar_library_takes_them(schema):
    assert grammar_text(StructuredOutputsParams(json=schema))
