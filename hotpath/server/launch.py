"""`hotpath serve`: build the engine, then run the app under uvicorn until SIGINT / SIGTERM.

Why FastAPI + uvicorn: the OpenAI API is a dozen JSON routes plus server-sent events, which
Starlette's StreamingResponse does directly; uvicorn is the ASGI server vLLM and SGLang deploy, with
graceful shutdown built in. Nothing here is on the per-token hot path except JSON encoding of chunks.
"""

from __future__ import annotations

import contextlib
import signal
import sys

import uvicorn

from hotpath.engine.args import EngineArgs


class _Server(uvicorn.Server):
    """uvicorn.Server whose signal handling ends in a clean exit (status 0).

    uvicorn re-raises a captured SIGINT/SIGTERM after its graceful shutdown, which would end the
    process with KeyboardInterrupt or the signal's status; a deployed server asked to stop should
    report success instead. A second SIGINT still forces the exit without waiting."""

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_server(
    engine_args: EngineArgs,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_body_bytes: int | None = None,
    shutdown_timeout: float = 30.0,
    uvicorn_log_level: str = "warning",
) -> int:
    from hotpath.engine.async_engine import AsyncEngine
    from hotpath.engine.engine import Engine
    from hotpath.server.app import DEFAULT_MAX_BODY_BYTES, build_app

    engine = Engine(engine_args)
    name = served_model_name or engine_args.model or _default_model_name()
    front = AsyncEngine(engine)
    app = build_app(front, name, api_key=api_key,
                    max_body_bytes=DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes)
    capacity = engine.kv_cache.num_blocks * engine.config.block_size
    shown_host = f"[{host}]" if ":" in host else host
    print(f"hotpath serve: model {name} ({engine.model_dir}) on {engine.device}, "
          f"{str(engine.dtype).removeprefix('torch.')}; KV cache {capacity} tokens "
          f"({engine.kv_cache.num_blocks} blocks of {engine.config.block_size}); "
          f"max_model_len {engine.config.max_model_len}; API key "
          f"{'required' if api_key else 'not required'}", file=sys.stderr)
    print(f"hotpath serve: listening on http://{shown_host}:{port}/v1 (Ctrl-C to stop)",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=uvicorn_log_level, access_log=False,
        timeout_graceful_shutdown=shutdown_timeout, lifespan="on",
    )
    server = _Server(config)
    server.run()
    # a failed start (port in use) leaves `started` unset; uvicorn has logged why
    if not server.started:
        return 1
    print("hotpath serve: stopped", file=sys.stderr, flush=True)
    return 0


def _default_model_name() -> str:
    from hotpath.assets import DEFAULT_MODEL

    return DEFAULT_MODEL
