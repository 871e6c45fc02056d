"""The offline API, shaped like vLLM's: LLM(model).generate(prompts, sampling_params)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceABC
from typing import Any

from tqdm.auto import tqdm

from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.multimodal.chat import extract_media
from hotpath.outputs import RequestOutput
from hotpath.sampling_params import SamplingParams

PromptType = str | dict | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        """`model` and any EngineArgs field by name (hotpath/args.py, the same names and
        defaults as vLLM's): dtype, max_model_len, tensor_parallel_size, speculative_config, ..."""
        self.engine = Engine(EngineArgs(model=model, **engine_args))
        self._request_ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | SequenceABC[PromptType],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generates for every prompt; returns RequestOutputs in input order.

        All prompts are validated before any runs, so bad input raises without side effects."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(prompts)} prompts but {len(params_list)} sampling params"
                )
        # tokenize (and preprocess images) and check every prompt before queueing any, so bad
        # input leaves nothing behind
        prompts = [self.engine.process_prompt(prompt) for prompt in prompts]
        ids = []
        try:
            for prompt, params in zip(prompts, params_list):
                request_id = str(next(self._request_ids))
                self.engine.add_request(request_id, prompt, params)
                ids.append(request_id)
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
    ) -> list[RequestOutput]:
        """Applies the tokenizer's chat template to each conversation, then generates. Content
        parts may carry images and videos (`image_url`, `video_url`, as OpenAI's and vLLM's
        chat APIs take them) for an image-text model. `tools`: OpenAI's tool objects
        ({"type": "function", "function": {"name", "description", "parameters"}}), which the
        template renders, as vLLM's LLM.chat takes them; the reply is the model's text (a tool call
        in it is not parsed out: the server's --tool-call-parser does that)."""
        _check_tools(tools)
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conversation in conversations:
            conversation, media = extract_media(conversation)
            prompt: dict = {"prompt_token_ids": self.apply_chat_template(
                conversation, add_generation_prompt, chat_template_kwargs, tools)}
            if media:
                prompt["multi_modal_data"] = media
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, kwargs: dict | None = None,
        tools: list[dict] | None = None,
    ) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init is set)")
        if not tok.chat_template:
            raise ValueError("this model's tokenizer has no chat template; use generate()")
        ids = tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True, **(kwargs or {})
        )
        # transformers 5 returns a BatchEncoding here, 4.x a plain list
        return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        pending = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc="Generating", unit="req", disable=not use_tqdm) as bar:
            while pending:
                for out in self.engine.step():
                    if out.finished and out.request_id in pending:
                        finished[out.request_id] = out
                        pending.discard(out.request_id)
                        bar.update(1)
        return [finished[r] for r in request_ids]


def _check_tools(tools: list[dict] | None) -> None:
    """OpenAI's tool objects, as a chat template expects them; a ValueError naming what is wrong."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list of tool objects, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                             f'"parameters": {{...}}}}}}, got {tool!r:.200}')
