"""OpenAI request bodies (pydantic) and the error type every handler raises.

Only the requests are modelled: responses are plain dicts built in serving.py, in OpenAI's field order.
A request body's fields are the ones declared here plus HARMLESS_FIELDS, which are accepted and do
nothing (they carry the client's bookkeeping, not anything the output depends on). Any other field is
refused with a 400 naming it: vLLM ignores unknown fields, so a client asking for something hotpath
does not do (logit_bias, guided_json, ...) would silently get output made without it. Nested objects
(messages, tools) ignore keys they do not know, since clients send back response messages whole.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError


class APIError(Exception):
    """An error answered in OpenAI's body shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# OpenAI's (and vLLM's) request fields that change nothing hotpath returns
HARMLESS_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
})


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestBody(BaseModel):
    """A request body: its undeclared fields are kept, for unsupported_field to look at."""

    model_config = ConfigDict(extra="allow")

    def unsupported_field(self) -> str | None:
        """The first field that is neither declared nor harmless, if any."""
        return next((name for name in self.model_extra or {} if name not in HARMLESS_FIELDS), None)


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(RequestBody):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # not in OpenAI's API; named as in vLLM's server
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's: the output held to one of json (a schema), regex, choice, grammar, json_object
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class MediaURL(_Request):
    url: str
    detail: str | None = None  # OpenAI's "low" / "high" / "auto"; the model's processor decides the size


class ImageURLPart(_Request):
    type: Literal["image_url"]
    image_url: MediaURL


class VideoURLPart(_Request):
    """vLLM's video content part."""

    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[TextPart | ImageURLPart | VideoURLPart, Field(discriminator="type")]
_PART_TYPES = ("text", "image_url", "video_url")


class FunctionCall(_Request):
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends the JSON text

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: str | dict[str, Any]) -> dict[str, Any]:
        """The arguments as a dict: templates write them out as JSON themselves (`| tojson`), or
        walk their items (Qwen3-Coder)."""
        if isinstance(arguments, dict):
            return arguments
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise PydanticCustomError("arguments", "is not valid JSON ({error})", {"error": str(e)}) from None
        if not isinstance(value, dict):
            raise PydanticCustomError("arguments", "must be a JSON object")
        return value


class ToolCall(_Request):
    """A call in an assistant message of the conversation sent back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # a string arrives as one text part: with no str member in this union, a bad part's error
    # names that part alone (pydantic reports a failed match against every member)
    content: list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this result answers
    reasoning_content: str | None = None  # assistant messages, as a reasoning parser split them

    @field_validator("content", mode="before")
    @classmethod
    def _string_as_text_part(cls, content: Any) -> Any:
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        if content is not None and not isinstance(content, list):
            raise ValueError("content must be a string or a list of content parts")
        for part in content or ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PART_TYPES:
                raise PydanticCustomError(
                    "content_part", "content parts of type {kind} are not supported: this server takes "
                    "text, image_url and video_url parts (images and videos for image-text models)",
                    {"kind": repr(kind)})
        return content

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.role == "tool":
            if not self.tool_call_id:
                raise PydanticCustomError("tool_message", "a tool message needs tool_call_id, the id of the "
                                                          "assistant's tool call that it answers")
            if any(not isinstance(part, TextPart) for part in self.content or ()):
                raise PydanticCustomError("tool_message", "a tool message's content must be text")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("tool_calls", "only assistant messages carry tool_calls, not {role} "
                                                    "messages", {"role": self.role})
        return self

    def template_message(self) -> dict[str, Any]:
        """The message as the chat template takes it: text parts joined into one string (which
        text-only templates need), a list of parts where an image or video is among them; tool
        calls with their arguments as a dict, as transformers' templates expect them."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": ""}
        if self.content is not None and all(isinstance(part, TextPart) for part in self.content):
            message["content"] = "".join(part.text for part in self.content)
        elif self.content is not None:
            message["content"] = [part.model_dump(exclude_none=True) for part in self.content]
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        for key in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class FunctionDefinition(_Request):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: ToolChoiceFunction


_TOOL_CHOICES = ("none", "auto", "required")


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    # None: "auto" where tools are given, as OpenAI defaults it
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # False: at most one call
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: per-request image / video preprocessing (min_pixels, max_pixels, fps)
    mm_processor_kwargs: dict[str, Any] | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, choice: Any) -> Any:
        """One clear error for a bad choice, rather than one per member of the union."""
        if choice is None or choice in _TOOL_CHOICES:
            return choice
        try:
            return NamedToolChoice.model_validate(choice)
        except ValidationError:
            raise PydanticCustomError(
                "tool_choice", 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                '"function": {"name": NAME}}, got {choice}', {"choice": json.dumps(choice)}) from None


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]
