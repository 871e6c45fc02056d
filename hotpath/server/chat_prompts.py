"""Chat messages -> the engine's prompt: the model's chat template, and for an image-text model
the images and videos of the messages loaded and preprocessed here, in the server's process.

Why here and not in the engine: decoding and resizing images and fetching URLs take milliseconds to
seconds per item and would stall every running request if the engine loop did them. The server
does them on a worker thread (the event loop keeps serving) and sends the engine a ProcessedPrompt,
whose tensors cross to the engine process in shared memory; the engine then only checks the limits.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

from hotpath.args import EngineArgs
from hotpath.engine.mm_inputs import MultiModalInputs
from hotpath.models.registry import read_config
from hotpath.multimodal.chat import extract_media
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.server.protocol import APIError, ChatMessage


def multimodal_inputs(args: EngineArgs, model_dir: str, tokenizer: Any) -> MultiModalInputs:
    """The engine's multimodal settings (limits, media policy, processor), built again in the
    server's process from the checkpoint and arguments the engine was started with."""
    model_config = read_config(model_dir)
    if args.language_model_only:
        model_config.multimodal = None
    return MultiModalInputs(model_config, Path(model_dir), tokenizer, args)


def require_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None:
        raise APIError(400, "this server runs without a tokenizer (--skip-tokenizer-init): "
                            "send prompts as token ids")
    return tokenizer


class ChatPrompts:
    def __init__(self, tokenizer: Any, mm_inputs: MultiModalInputs) -> None:
        self.tokenizer = tokenizer  # None with --skip-tokenizer-init
        self.mm_inputs = mm_inputs

    async def prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                     template_kwargs: dict[str, Any] | None = None,
                     mm_processor_kwargs: dict[str, Any] | None = None,
                     tools: list[dict[str, Any]] | None = None) -> list[int] | ProcessedPrompt:
        """Token ids for text-only messages; a ProcessedPrompt (placeholders expanded, media
        preprocessed) where the messages carry images or videos. `tools`: OpenAI's tool objects,
        which the template renders (as transformers' apply_chat_template(tools=...) passes them).
        APIError 400 for what cannot be this model's prompt."""
        conversation, media = extract_media([m.template_message() for m in messages])
        if media:  # first: a text-only model's template may fail on the media parts with a vaguer error
            self._check_takes_media()
        ids = self._apply_template(conversation, add_generation_prompt, template_kwargs, tools)
        if not media:
            return ids
        prompt: dict[str, Any] = {"prompt_token_ids": ids, "multi_modal_data": media}
        if mm_processor_kwargs:
            prompt["mm_processor_kwargs"] = mm_processor_kwargs
        try:
            return await asyncio.to_thread(self.mm_inputs.process, prompt)
        except ValueError as e:  # MediaError among them: a refused URL, undecodable bytes, a limit
            raise APIError(400, str(e)) from e

    def _check_takes_media(self) -> None:
        mm = self.mm_inputs
        if mm.model_config.multimodal is None:
            why = " (the server runs it with --language-model-only)" if mm.language_model_only else ""
            raise APIError(400, f"this model ({mm.model_config.architecture}) takes no images or videos"
                                f"{why}; send text only", param="messages")

    def _apply_template(self, conversation: list[dict[str, Any]], add_generation_prompt: bool,
                        template_kwargs: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> list[int]:
        tok = require_tokenizer(self.tokenizer)
        if not tok.chat_template:
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions",
                           param="messages")
        template_kwargs = template_kwargs or {}
        # the template's own variables (enable_thinking, ...) only: apply_chat_template's
        # parameters are set by the request's own fields
        taken = sorted(set(template_kwargs) & _apply_template_parameters(tok))
        if taken:
            raise APIError(400, f"chat_template_kwargs cannot set {', '.join(taken)}: those are "
                                "apply_chat_template's own parameters, set from the request's fields",
                           param="chat_template_kwargs")
        try:
            ids = tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=add_generation_prompt,
                                          tokenize=True, **template_kwargs)
        except Exception as e:  # the template's own errors (jinja raise_exception) are user input errors
            raise APIError(400, f"cannot apply the chat template to these messages: {e}",
                           param="messages") from e
        # transformers 5 returns a BatchEncoding here, 4.x a plain list
        return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)


def _apply_template_parameters(tok: Any) -> set[str]:
    """apply_chat_template's named parameters (conversation, tools, tokenize, ...)."""
    return {name for name, p in inspect.signature(tok.apply_chat_template).parameters.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD}
