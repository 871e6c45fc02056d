"""The FastAPI app: routes, API-key check, body size limit, OpenAI-shaped errors.

Request bodies are read and validated here by hand rather than through FastAPI's body parameters, so
every failure (size, JSON syntax, types) becomes a 4xx in OpenAI's error shape, never FastAPI's 422.
"""

from __future__ import annotations

import json
import logging
import secrets
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

from hotpath import __version__
from hotpath.args import EngineArgs
from hotpath.engine.front import EngineDeadError, EngineFront
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.server.chat_prompts import multimodal_inputs
from hotpath.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from hotpath.server.metrics import ServerMetrics
from hotpath.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    RequestBody,
    TokenizeRequest,
)
from hotpath.server.serving import OpenAIServing
from hotpath.server.tool_choice import ParserOptions

logger = logging.getLogger("hotpath")

DEFAULT_MAX_BODY_BYTES = 16 << 20
# Routes that need the API key when one is set; /health, /version and /metrics stay open for
# probes, scrapers and version checks, as vLLM leaves them.
_PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
# The web chat page (GET /): plain files, no build step; a client of the routes below like any other.
_STATIC_DIR = Path(__file__).parent / "static"
# nothing from another origin, so the page works offline and model output cannot pull anything in
_PAGE_CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
_ROUTES = ("/health", "/version", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
           "/tokenize", "/detokenize")


class _BodyTooLarge(Exception):
    pass


class _Guard:
    """ASGI middleware: API key, body size limit, and per-route response counts for /metrics."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = next((r for r in _ROUTES if path == r or path.startswith(r + "/")), "other")
        status = 500

        async def counting_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            error = self._check(scope, path)
            if error is not None:
                await _error_response(error)(scope, receive, counting_send)
                return
            await self.app(scope, self._limited(receive), counting_send)
        finally:
            self.metrics.count_http(route, status)

    def _check(self, scope, path: str) -> APIError | None:
        headers = dict(scope["headers"])
        if self.api_key is not None and path.startswith(_PROTECTED_PREFIXES):
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), self.api_key):
                return APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                                type="invalid_request_error", code="invalid_api_key")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return _too_large(self.max_body_bytes)
        return None

    def _limited(self, receive):
        """receive() that stops a chunked body once it passes the limit."""
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge()
            return message

        return limited_receive


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is over this server's limit of {limit} bytes",
                    code="request_too_large")


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _parse(request: Request, cls: type[RequestBody], max_body_bytes: int) -> RequestBody:
    try:
        raw = await request.body()
    except _BodyTooLarge:
        raise _too_large(max_body_bytes) from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        req = cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        raise APIError(400, f"{param}: {err['msg']}" if param else err["msg"], param=param) from None
    unsupported = req.unsupported_field()
    if unsupported is not None:
        raise APIError(400, f"{unsupported}: this server does not support this field, and serving the "
                            "request without it could give other output than asked for; remove it",
                       param=unsupported)
    return req


def build_app(
    front: EngineFront,
    model_name: str,
    engine_args: EngineArgs,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    parser_options: ParserOptions | None = None,
) -> _Guard:
    """The ASGI app around a (not yet started) engine front; its lifespan starts it and, once
    uvicorn has drained the requests in flight, stops the engine. `engine_args`: those the engine
    was started with, for the image and video settings that the server applies."""
    metrics = ServerMetrics(model_name, front)
    front.on_finished = metrics.observe_finished
    mm_inputs = multimodal_inputs(engine_args, front.info.model_dir, front.tokenizer)
    serving = OpenAIServing(front, model_name, mm_inputs, parser_options)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        front.start()
        try:
            yield
        finally:
            front.shutdown()

    app = FastAPI(title="hotpath", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error_response(APIError(e.status_code, str(e.detail),
                                        code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, e: EngineDeadError) -> JSONResponse:
        return _error_response(APIError(503, str(e), type="server_error"))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return _error_response(APIError(500, f"internal server error: {type(e).__name__}: {e}",
                                        type="server_error"))

    @app.get("/")
    async def chat_page() -> FileResponse:
        return FileResponse(_STATIC_DIR / "index.html",
                            headers={"Content-Security-Policy": _PAGE_CSP, "Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=_STATIC_DIR), name="static")

    @app.get("/health")
    async def health() -> Response:
        if not front.is_running:
            raise APIError(503, str(front.error or "the engine is not running"), type="server_error")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:  # vLLM's route and shape
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [serving.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> dict:
        serving.check_model(model_id)
        return serving.model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest, max_body_bytes)
        return await serving.create_completion(req, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest, max_body_bytes)
        return await serving.create_chat_completion(req, request)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        req = await _parse(request, TokenizeRequest, max_body_bytes)
        serving.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of prompt and messages")
        if req.prompt is not None:
            tokens = serving.encode(req.prompt, req.add_special_tokens)
        else:
            prompt = await serving.chat_prompt(req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                                               req.mm_processor_kwargs,
                                               [t.model_dump(exclude_none=True) for t in req.tools or ()] or None)
            # with images, the ids the engine would run: placeholders expanded
            tokens = prompt.prompt_token_ids if isinstance(prompt, ProcessedPrompt) else prompt
        return {"tokens": tokens, "count": len(tokens), "max_model_len": serving.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        req = await _parse(request, DetokenizeRequest, max_body_bytes)
        serving.check_model(req.model)
        serving.check_token_ids(req.tokens, "tokens")
        return {"prompt": serving.require_tokenizer().decode(req.tokens)}

    return _Guard(app, api_key, max_body_bytes, metrics)
