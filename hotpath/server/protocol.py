"""OpenAI request bodies (pydantic) and the error type every handler raises.

Only the requests are modelled: responses are plain dicts built in serving.py, in OpenAI's field order.
Unknown request fields are ignored, as vLLM does, so clients that send newer OpenAI fields still work;
fields that change the output but that hotpath does not implement are rejected (see serving.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


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


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
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


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    # a string arrives as one text part: with no str member in this union, a bad part's error
    # names that part alone (pydantic reports a failed match against every member)
    content: list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _string_as_text_part(cls, content: Any) -> Any:
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        if content is not None and not isinstance(content, list):
            raise ValueError("content must be a string or a list of content parts")
        return content

    def template_message(self) -> dict[str, Any]:
        """The message as the chat template takes it: text parts joined into one string (which
        text-only templates need), a list of parts where an image or video is among them."""
        role = "system" if self.role == "developer" else self.role
        if self.content is None:
            return {"role": role, "content": ""}
        if all(isinstance(part, TextPart) for part in self.content):
            return {"role": role, "content": "".join(part.text for part in self.content)}
        return {"role": role, "content": [part.model_dump(exclude_none=True) for part in self.content]}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: per-request image / video preprocessing (min_pixels, max_pixels, fps)
    mm_processor_kwargs: dict[str, Any] | None = None


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    mm_processor_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
