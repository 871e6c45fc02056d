"""The OpenAI endpoints' logic: request -> prompt token ids + SamplingParams -> engine streams ->
a response body, or server-sent events in OpenAI's chunk format.

Every check that can fail on user input runs before anything is queued, so a bad request costs the
engine nothing and is answered with an APIError (400 / 404) in OpenAI's error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request
from starlette.responses import Response

from hotpath.engine.front import EngineDeadError, EngineFront, RequestStream
from hotpath.engine.mm_inputs import MultiModalInputs
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.outputs import CompletionOutput, Logprob, RequestOutput
from hotpath.sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutputsParams
from hotpath.server.chat_output import ChatDelta, ChatOutputParser
from hotpath.server.chat_prompts import ChatPrompts, require_tokenizer
from hotpath.server.protocol import APIError, ChatCompletionRequest, ChatMessage, CompletionRequest
from hotpath.server.tool_choice import ParserOptions, RequestTools, output_parser

MAX_N = 128  # choices per request, as OpenAI caps n
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; tokens masked by top-k/top-p get this, as in vLLM


class OpenAIServing:
    def __init__(self, front: EngineFront, model_name: str, mm_inputs: MultiModalInputs,
                 parser_options: ParserOptions | None = None) -> None:
        self.front = front
        self.parser_options = parser_options or ParserOptions()
        self.tokenizer = front.tokenizer
        self.chat_prompts = ChatPrompts(front.tokenizer, mm_inputs)
        self.model_name = model_name
        self.max_model_len = front.info.max_model_len
        self.vocab_size = front.info.vocab_size
        self.created = int(time.time())

    # ---- models -------------------------------------------------------------------------
    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "hotpath", "root": self.front.info.model_dir,
                "max_model_len": self.max_model_len}

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                                f"`{self.model_name}`.", param="model", code="model_not_found")

    # ---- prompts ------------------------------------------------------------------------
    def require_tokenizer(self):
        return require_tokenizer(self.tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.require_tokenizer().encode(text, add_special_tokens=add_special_tokens))

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(400, f"token ids must be in [0, {self.vocab_size}); got {bad[:5]}", param=param)

    def completion_prompts(self, prompt) -> list[list[int]]:
        """A completion request's prompt(s) as token id lists: str, [str], [int] or [[int]]."""
        if isinstance(prompt, str):
            prompts = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        result = []
        for p in prompts:
            ids = self.encode(p) if isinstance(p, str) else list(p)
            if not ids:
                raise APIError(400, "prompt must not be empty", param="prompt")
            self.check_token_ids(ids, "prompt")
            result.append(ids)
        return result

    async def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                          chat_template_kwargs: dict | None = None,
                          mm_processor_kwargs: dict | None = None,
                          tools: list[dict] | None = None) -> list[int] | ProcessedPrompt:
        prompt = await self.chat_prompts.prompt(messages, add_generation_prompt, chat_template_kwargs,
                                                mm_processor_kwargs, tools)
        ids = prompt.prompt_token_ids if isinstance(prompt, ProcessedPrompt) else prompt
        self.check_token_ids(ids, "messages")
        return prompt

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None, param: str) -> None:
        limit = self.max_model_len
        if num_prompt_tokens >= limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens, but the "
                                f"prompt is {num_prompt_tokens} tokens (it must leave room for at least "
                                "one generated token). Shorten the prompt.",
                           param=param, code="context_length_exceeded")
        if max_tokens is not None and num_prompt_tokens + max_tokens > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, "
                                f"you requested {num_prompt_tokens + max_tokens} tokens "
                                f"({num_prompt_tokens} in the prompt, {max_tokens} for the completion). "
                                "Shorten the prompt or lower max_tokens.",
                           param="max_tokens", code="context_length_exceeded")

    # ---- sampling -----------------------------------------------------------------------
    def sampling_params(self, req, max_tokens: int | None, logprobs: int | None,
                        logprobs_field: str = "logprobs") -> SamplingParams:
        """`logprobs_field`: the request field `logprobs` came from, which an error must name."""
        if not 1 <= req.n <= MAX_N:
            raise APIError(400, f"n must be in [1, {MAX_N}], got {req.n}", param="n")
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"{logprobs_field} must be in [0, {MAX_LOGPROBS}], got {logprobs}",
                           param=logprobs_field)
        try:
            return SamplingParams(
                n=req.n,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=0 if req.top_k is None else req.top_k,
                min_p=0.0 if req.min_p is None else req.min_p,
                seed=req.seed,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                logprobs=logprobs,
                ignore_eos=req.ignore_eos,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                structured_outputs=structured_outputs(req),
            )
        except ValueError as e:
            # SamplingParams' messages start with the field's name
            raise APIError(400, str(e), param=str(e).split(" ", 1)[0]) from e

    # ---- /v1/completions ----------------------------------------------------------------
    async def create_completion(self, req: CompletionRequest, raw: Request) -> dict | Response:
        self.check_model(req.model)
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        prompts = self.completion_prompts(req.prompt)
        max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default here
        for ids in prompts:
            self.check_length(len(ids), max_tokens, "prompt")
        params = self.sampling_params(req, max_tokens, req.logprobs)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        streams = await self._add(request_id, prompts, params)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._completion_chunks(request_id, streams, params, include_usage), streams)
        finals = await _until_disconnected(raw, _collect(streams))
        if finals is None:
            return Response(status_code=499)
        choices = []
        for p, out in enumerate(finals):
            for o in out.outputs:
                choices.append({
                    "index": p * params.n + o.index,
                    "text": o.text,
                    "logprobs": self._completion_logprobs(o, 0, 0) if params.logprobs is not None else None,
                    "finish_reason": _finish_reason(o),
                })
        return {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": _usage(finals)}

    async def _completion_chunks(self, request_id: str, streams: list[RequestStream],
                                 params: SamplingParams, include_usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        head, tail = _chunk_frame(request_id, "text_completion", created, self.model_name, include_usage)
        sent_text: dict[int, int] = {}  # choice index -> characters sent
        sent_tokens: dict[int, int] = {}
        finished: set[int] = set()  # choices whose finish_reason was sent
        finals: list[RequestOutput | None] = [None] * len(streams)
        async with aclosing(_merge(streams)) as merged:
            async for p, out in merged:
                for o in out.outputs:
                    index = p * params.n + o.index
                    if index in finished:
                        continue
                    n_text, n_tok = sent_text.get(index, 0), sent_tokens.get(index, 0)
                    delta = o.text[n_text:]
                    finish = _finish_reason(o)
                    new_tokens = len(o.token_ids) > n_tok
                    if not delta and not finish and not (new_tokens and params.logprobs is not None):
                        continue
                    logprobs = None
                    if params.logprobs is not None:
                        logprobs = self._completion_logprobs(o, n_tok, n_text)
                        sent_tokens[index] = len(o.token_ids)
                    sent_text[index] = len(o.text)
                    if finish:
                        finished.add(index)
                    yield head + _JSON.encode([{"index": index, "text": delta, "logprobs": logprobs,
                                                "finish_reason": finish}]) + tail
                if out.finished:
                    finals[p] = out
        if include_usage:
            yield _sse({"id": request_id, "object": "text_completion", "created": created,
                        "model": self.model_name, "choices": [], "usage": _usage(finals)})

    def _completion_logprobs(self, o: CompletionOutput, start: int, text_offset: int) -> dict:
        """The legacy completions logprobs object for tokens [start:] of one output."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        offset = text_offset
        for token_id, entry in zip(o.token_ids[start:], o.logprobs[start:]):
            chosen = entry[token_id]
            text = _token_text(chosen, token_id)
            tokens.append(text)
            token_logprobs.append(_finite(chosen.logprob))
            top_logprobs.append({_token_text(lp, tid): _finite(lp.logprob) for tid, lp in _ranked(entry)})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    # ---- /v1/chat/completions -----------------------------------------------------------
    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request) -> dict | Response:
        self.check_model(req.model)
        tools = RequestTools.from_request(req, self.parser_options)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        # the sampling fields first: they are checked before any image is fetched or decoded
        params = self.sampling_params(req, max_tokens, logprobs, "top_logprobs")
        constraint = tools.constraint() if tools else None
        if constraint is not None:
            if params.structured_outputs is not None:
                raise APIError(400, f'tool_choice "{tools.choice}" constrains the output itself; it cannot be '
                                    "combined with response_format or structured_outputs", param="tool_choice")
            params.structured_outputs = constraint
        prompt = await self.chat_prompt(req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                                        req.mm_processor_kwargs, tools.template_tools if tools else None)
        ids = prompt.prompt_token_ids if isinstance(prompt, ProcessedPrompt) else prompt
        self.check_length(len(ids), max_tokens, "messages")
        # the prompt's end says whether the reply starts inside a reasoning block
        tail = self.tokenizer.decode(ids[-8:]) if self.parser_options.reasoning_parser else ""
        parsers = [output_parser(self.parser_options, tools, tail) for _ in range(params.n)]
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self._add(request_id, [prompt], params)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._chat_chunks(request_id, streams[0], params, parsers, include_usage),
                               streams)
        finals = await _until_disconnected(raw, _collect(streams))
        if finals is None:
            return Response(status_code=499)
        choices = [{
            "index": o.index,
            "message": parsers[o.index].message(o.text),
            "logprobs": {"content": self._chat_logprobs(o, 0)} if params.logprobs is not None else None,
            "finish_reason": _chat_finish_reason(o, parsers[o.index]),
        } for o in finals[0].outputs]
        return {"id": request_id, "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": _usage(finals)}

    async def _chat_chunks(self, request_id: str, stream: RequestStream, params: SamplingParams,
                           parsers: list[ChatOutputParser], include_usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        head, tail = _chunk_frame(request_id, "chat.completion.chunk", created, self.model_name, include_usage)

        def chunk(choices: list[dict]) -> str:
            return head + _JSON.encode(choices) + tail

        # the role comes first, before the engine has produced anything, as OpenAI sends it
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(params.n)])
        sent_text = [0] * params.n
        sent_tokens = [0] * params.n
        finished: set[int] = set()
        final = None
        async for out in stream:
            for o in out.outputs:
                if o.index in finished:
                    continue
                parser = parsers[o.index]
                text = o.text[sent_text[o.index]:]
                sent_text[o.index] = len(o.text)
                delta = parser.feed(text) if text else ChatDelta()
                if o.finish_reason is not None:
                    delta.extend(parser.finish())
                finish = _chat_finish_reason(o, parser)
                new_tokens = len(o.token_ids) > sent_tokens[o.index]
                if not delta and not finish and not (new_tokens and params.logprobs is not None):
                    continue
                logprobs = None
                if params.logprobs is not None:
                    logprobs = {"content": self._chat_logprobs(o, sent_tokens[o.index])}
                    sent_tokens[o.index] = len(o.token_ids)
                if finish:
                    finished.add(o.index)
                yield chunk([{"index": o.index, "delta": delta.fields(), "logprobs": logprobs,
                              "finish_reason": finish}])
            if out.finished:
                final = out
        if include_usage:
            yield _sse({"id": request_id, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_name, "choices": [], "usage": _usage([final])})

    def _chat_logprobs(self, o: CompletionOutput, start: int) -> list[dict]:
        content = []
        for token_id, entry in zip(o.token_ids[start:], o.logprobs[start:]):
            chosen = entry[token_id]
            text = _token_text(chosen, token_id)
            content.append({
                "token": text, "logprob": _finite(chosen.logprob), "bytes": list(text.encode()),
                "top_logprobs": [{"token": _token_text(lp, tid), "logprob": _finite(lp.logprob),
                                  "bytes": list(_token_text(lp, tid).encode())}
                                 for tid, lp in _ranked(entry)],
            })
        return content

    # ---- engine ---------------------------------------------------------------------------
    async def _add(self, request_id: str, prompts: list[list[int] | ProcessedPrompt],
                   params: SamplingParams) -> list[RequestStream]:
        """Queues one engine request per prompt; on any failure none stays queued."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                if not isinstance(prompt, ProcessedPrompt):
                    prompt = {"prompt_token_ids": prompt}
                streams.append(await self.front.add_request(rid, prompt, params))
        except BaseException as e:
            for s in streams:
                s.close()
            if isinstance(e, ValueError):
                raise APIError(400, str(e)) from e
            if isinstance(e, EngineDeadError):
                raise APIError(503, str(e), type="server_error") from e
            raise
        return streams


class SSEResponse(Response):
    """Server-sent events that end with [DONE]; closes the event source however the response ends,
    so a client that disconnects mid-stream has its requests aborted at once.

    Its own ASGI call rather than Starlette's StreamingResponse: each event goes to `send` as it
    comes, with a task of its own only to hear the client leave (cancelling this one), where
    StreamingResponse runs an anyio task group and re-encodes every chunk; a stream's events are the
    server's busiest path (one per token and stream)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], streams: list[RequestStream]) -> None:
        self._events = events
        self._streams = streams
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with aclosing(self._events):
                try:
                    async for event in self._events:
                        await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
                except APIError as e:
                    await send({"type": "http.response.body", "body": _sse(e.body()).encode(), "more_body": True})
                except EngineDeadError as e:
                    body = _sse(APIError(503, str(e), type="server_error").body()).encode()
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        except asyncio.CancelledError:
            if not disconnected:  # the server cut the request off (a shutdown past its drain timeout)
                with contextlib.suppress(Exception):
                    body = _sse(APIError(503, "the server stopped before this response was complete",
                                         type="server_error").body()).encode()
                    await send({"type": "http.response.body", "body": body + b"data: [DONE]\n\n",
                                "more_body": False})
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was this response's own, not the task's
                task.uncancel()  # the client left: nothing more to send, and the response is done
        finally:
            watcher.cancel()
            for stream in self._streams:
                stream.close()


# ---- helpers ----------------------------------------------------------------------------------
async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several streams as they come; closing it closes them all."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].close()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
        except Exception as e:
            await queue.put((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.close()


async def _collect(streams: list[RequestStream]) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * len(streams)
    async with aclosing(_merge(streams)) as merged:
        async for i, out in merged:
            finals[i] = out
    return finals


async def _until_disconnected(raw: Request, coro) -> object | None:
    """Awaits coro, cancelling it (so its requests are aborted) if the client disconnects first;
    returns None then."""
    work = asyncio.ensure_future(coro)

    async def disconnected() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        watch.cancel()
    if work.cancelled():
        return None
    return work.result()


def structured_outputs(req) -> StructuredOutputsParams | dict | None:
    """The request's constraint: chat's OpenAI `response_format` (json_object, or json_schema with
    its schema), or vLLM's `structured_outputs` fields (SamplingParams checks them); whether it
    compiles is the engine's to say (a ValueError, answered 400, naming the reason)."""
    fmt = getattr(req, "response_format", None)
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return req.structured_outputs
    if req.structured_outputs is not None:
        raise APIError(400, "set response_format or structured_outputs, not both", param="response_format")
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise APIError(400, f"response_format type {kind!r} is not supported: use text, json_object or "
                            "json_schema", param="response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise APIError(400, "response_format json_schema needs json_schema.schema, a JSON schema object",
                       param="response_format")
    return StructuredOutputsParams(json=spec["schema"])


def _finish_reason(o: CompletionOutput) -> str | None:
    if o.finish_reason is None:
        return None
    return "length" if o.finish_reason == "length" else "stop"


def _chat_finish_reason(o: CompletionOutput, parser: ChatOutputParser) -> str | None:
    """OpenAI's "tool_calls" where the model stopped after calling tools ("stop" still for a
    named function)."""
    reason = _finish_reason(o)
    return parser.tools.finish_reason if reason == "stop" and parser.tools_called else reason


def _usage(finals: list[RequestOutput]) -> dict:
    prompt = sum(len(f.prompt_token_ids) for f in finals)
    completion = sum(len(o.token_ids) for f in finals for o in f.outputs)
    cached = sum(f.num_cached_tokens for f in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _ranked(entry: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(((tid, lp) for tid, lp in entry.items() if lp.rank is not None), key=lambda x: x[1].rank)


def _token_text(lp: Logprob, token_id: int) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{token_id}"


def _finite(x: float) -> float:
    return x if math.isfinite(x) else LOGPROB_FLOOR


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # one encoder, not one a chunk


def _sse(body: dict) -> str:
    return f"data: {_JSON.encode(body)}\n\n"


def _chunk_frame(request_id: str, kind: str, created: int, model: str, include_usage: bool) -> tuple[str, str]:
    """A stream's chunk event around its `choices` (the only part that changes): (head, tail)."""
    head = (f'data: {{"id":{_JSON.encode(request_id)},"object":"{kind}","created":{created},'
            f'"model":{_JSON.encode(model)},"choices":')
    return head, (',"usage":null}\n\n' if include_usage else "}\n\n")
