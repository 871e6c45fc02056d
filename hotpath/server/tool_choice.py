"""A chat request's `tools` and `tool_choice` checked against the server's flags, and what follows
from them: the tools the chat template renders, the output's constraint, the parsers of its text.

vLLM's rules: `tool_choice` defaults to "auto" when tools are given; "auto" needs the server started
with `--enable-auto-tool-choice` and a `--tool-call-parser`, since the model's own format is parsed;
"none" renders the tools and parses nothing; "required" and a named function constrain the output
to JSON (tool_parsers/forced_choice.py), so they need no parser and always parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotpath.sampling_params import StructuredOutputsParams
from hotpath.server.chat_output import ChatOutputParser
from hotpath.server.protocol import APIError, ChatCompletionRequest, NamedToolChoice
from hotpath.server.reasoning import REASONING_PARSERS
from hotpath.server.tool_parsers import TOOL_PARSERS, ToolParser
from hotpath.server.tool_parsers.forced_choice import (
    NamedFunctionParser,
    RequiredToolParser,
    function_schema,
    required_schema,
)
from hotpath.structured.backend import grammar_text


@dataclass(frozen=True)
class ParserOptions:
    """`hotpath serve`'s --reasoning-parser, --tool-call-parser, --enable-auto-tool-choice."""

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_PARSERS)}, "
                             f"got {self.tool_call_parser!r}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes for Qwen2.5 and "
                             "Qwen3, qwen3_coder for Qwen3-Coder)")


@dataclass
class RequestTools:
    choice: str  # "none", "auto", "required" or "function" (the named one)
    schemas: dict[str, dict | None]  # each tool's name -> its parameters' JSON schema
    template_tools: list[dict]  # as the chat template takes them: OpenAI's tool objects
    parallel: bool = True  # parallel_tool_calls
    function: str | None = None  # the named function

    @classmethod
    def from_request(cls, req: ChatCompletionRequest, options: ParserOptions) -> RequestTools | None:
        """None for a request without tools; APIError 400 for a choice this server cannot serve."""
        if not req.tools:
            if req.tool_choice not in (None, "none"):
                raise APIError(400, "tool_choice needs tools: send the functions the model may call",
                               param="tool_choice")
            return None
        schemas = {t.function.name: t.function.parameters for t in req.tools}
        choice = "function" if isinstance(req.tool_choice, NamedToolChoice) else req.tool_choice or "auto"
        tools = cls(choice, schemas, [t.model_dump(exclude_none=True) for t in req.tools], req.parallel_tool_calls)
        if tools.choice == "auto" and not options.enable_auto_tool_choice:
            raise APIError(400, 'tool_choice "auto" (the default when tools are given) needs the server '
                                "started with --enable-auto-tool-choice and --tool-call-parser (hermes for "
                                "Qwen2.5 and Qwen3, qwen3_coder for Qwen3-Coder); or send tool_choice "
                                '"none", "required" or a named function', param="tool_choice")
        if tools.choice == "function":
            tools.function = req.tool_choice.function.name
            if tools.function not in schemas:
                raise APIError(400, f"tool_choice names the function {tools.function!r}, which is not among "
                                    f"the tools ({', '.join(schemas)})", param="tool_choice")
        return tools

    def constraint(self) -> StructuredOutputsParams | None:
        """The JSON schema the output must follow: for "required" and a named function only;
        APIError 400, naming the tools, where their schemas cannot be one."""
        if self.choice not in ("required", "function"):
            return None
        try:
            if self.choice == "function":
                params = StructuredOutputsParams(json=function_schema(self.schemas[self.function]))
            else:
                params = StructuredOutputsParams(json=required_schema(self.schemas, self.parallel))
            grammar_text(params)
        except ValueError as e:
            raise APIError(400, f'tool_choice "{self.choice}" holds the output to the tools\' parameters '
                                f"schemas, and these cannot be used: {e}", param="tools") from e
        return params

    def parser(self, tool_call_parser: str | None) -> ToolParser | None:
        schemas = {name: schema or {} for name, schema in self.schemas.items()}
        if self.choice == "auto":
            return TOOL_PARSERS[tool_call_parser](schemas)
        if self.choice == "required":
            return RequiredToolParser(schemas)
        if self.choice == "function":
            return NamedFunctionParser(schemas, self.function)
        return None


def output_parser(options: ParserOptions, tools: RequestTools | None, prompt_tail: str) -> ChatOutputParser:
    """A choice's parser. A constrained output (structured_outputs, response_format, a required or
    named tool call) follows its grammar after the reasoning block where a reasoning parser is set:
    the engine gets the same parser (EngineArgs.reasoning_parser) and holds the grammar back until
    the block ends."""
    reasoning = None
    if options.reasoning_parser is not None:
        reasoning = REASONING_PARSERS[options.reasoning_parser](prompt_tail)
    if tools is None:
        return ChatOutputParser(reasoning, None)
    return ChatOutputParser(reasoning, tools.parser(options.tool_call_parser), max_calls=None if tools.parallel else 1)
