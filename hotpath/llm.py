"""The offline API, shaped like vLLM's: LLM(model).generate(prompts, sampling_params)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as SequenceABC

from tqdm.auto import tqdm

from hotpath.engine.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.outputs import RequestOutput
from hotpath.sampling_params import SamplingParams

PromptType = str | dict | list[int]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        load_format: str = "auto",
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        max_model_len: int | None = None,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        seed: int = 0,
        skip_tokenizer_init: bool = False,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks_override: int | None = None,
        enforce_eager: bool = False,
        async_scheduling: bool | None = None,
        state_snapshot_stride: int = 1024,
        speculative_config: dict | str | None = None,
    ) -> None:
        self.engine = Engine(EngineArgs(
            model=model, tokenizer=tokenizer, dtype=dtype, device=device, load_format=load_format,
            quantization=quantization, kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, seed=seed,
            skip_tokenizer_init=skip_tokenizer_init,
            gpu_memory_utilization=gpu_memory_utilization,
            num_gpu_blocks_override=num_gpu_blocks_override, enforce_eager=enforce_eager,
            async_scheduling=async_scheduling, state_snapshot_stride=state_snapshot_stride,
            speculative_config=speculative_config,
        ))
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
        # tokenize and check every prompt before queueing any, so bad input leaves nothing behind
        tokenized = []
        for prompt in prompts:
            text, token_ids = self.engine.tokenize_prompt(prompt)
            tokenized.append({"prompt": text, "prompt_token_ids": token_ids})
        prompts = tokenized
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
    ) -> list[RequestOutput]:
        """Applies the tokenizer's chat template to each conversation, then generates."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            {"prompt_token_ids": self.apply_chat_template(c, add_generation_prompt, chat_template_kwargs)}
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, kwargs: dict | None = None
    ) -> list[int]:
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init is set)")
        if not tok.chat_template:
            raise ValueError("this model's tokenizer has no chat template; use generate()")
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, **(kwargs or {})
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
