"""`hotpath serve`: start the engine (in its own process by default), then run the app under uvicorn
until SIGINT / SIGTERM.

Why FastAPI + uvicorn: the OpenAI API is a dozen JSON routes plus server-sent events (an ASGI
response of a few lines: serving.SSEResponse); uvicorn is the ASGI server vLLM and SGLang deploy,
with graceful shutdown built in. Nothing here is on the per-token hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

import uvicorn

from hotpath.args import EngineArgs
from hotpath.engine.dp_front import DataParallelFront
from hotpath.engine.engine_client import EngineClient, EngineStartupError
from hotpath.engine.front import EngineFront
from hotpath.server.tool_choice import ParserOptions


class _Server(uvicorn.Server):
    """uvicorn.Server that says what it does on SIGINT/SIGTERM and whose signal handling ends in a
    clean exit (status 0).

    The first signal starts uvicorn's graceful shutdown: no new connections, the requests in flight
    drain for up to --shutdown-timeout seconds, then are cut off. A second signal (SIGINT or SIGTERM;
    uvicorn itself honours only a second SIGINT, by skipping the app's shutdown) stops at once: the
    connections are closed, so that the requests in flight end as if their clients had gone (their
    engine requests aborted), and the shutdown goes on as after a drain. uvicorn re-raises a
    captured signal after its shutdown, which would end the process with KeyboardInterrupt or the
    signal's status; a deployed server asked to stop should report success instead."""

    _loop: asyncio.AbstractEventLoop | None = None
    _stopping_now = False

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        in_flight = len(self.server_state.tasks)  # one task per HTTP request being served
        if not self.should_exit:
            self.should_exit = True
            if in_flight:
                timeout = self.config.timeout_graceful_shutdown
                _say(f"hotpath serve: draining {_requests(in_flight)} in flight (up to {timeout:g} s; "
                     "Ctrl-C again to stop now)")
            else:
                _say("hotpath serve: shutting down")
        elif not self._stopping_now:
            self._stopping_now = True
            _say(f"hotpath serve: stopping now{f', cutting off {_requests(in_flight)}' if in_flight else ''}")
            if self._loop is not None:
                # from a signal handler only call_soon_threadsafe is safe: it wakes the loop
                self._loop.call_soon_threadsafe(self._disconnect_all)

    def _disconnect_all(self) -> None:
        """Closes every connection: each request in flight ends as if its client had gone (its
        engine request aborted, no error logged), and the shutdown goes on as after a drain."""
        for connection in list(self.server_state.connections):
            connection.transport.close()


def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


def _say(line: str) -> None:
    """A line on stderr from a signal handler: os.write, as print() could re-enter a write to
    sys.stderr that the signal interrupted (RuntimeError: reentrant call)."""
    try:
        os.write(sys.stderr.fileno(), (line + "\n").encode())
    except (OSError, ValueError):  # no stderr to write to (closed, or not a file)
        pass


def run_server(
    engine_args: EngineArgs,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_body_bytes: int | None = None,
    shutdown_timeout: float = 30.0,
    uvicorn_log_level: str = "warning",
    access_log: bool = True,
    engine_process: bool = True,
    parser_options: ParserOptions | None = None,
) -> int:
    from hotpath.server.app import DEFAULT_MAX_BODY_BYTES, build_app

    # until uvicorn takes the signals over, SIGTERM interrupts the (possibly long) start like Ctrl-C,
    # so that the engine process is stopped too
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        front = _start_engine(engine_args, engine_process)
    except KeyboardInterrupt:
        print("hotpath serve: stopped before the engine was ready", file=sys.stderr, flush=True)
        return 0
    except EngineStartupError as e:
        print(f"hotpath serve: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if engine_process:
        # this process runs no model, only requests' preprocessing on many threads at once: torch
        # ops with intra-op threads each would oversubscribe the cores (and spin beside the engine)
        import torch

        torch.set_num_threads(1)
    try:
        name = served_model_name or engine_args.model or _default_model_name()
        app = build_app(front, name, engine_args, api_key=api_key,
                        max_body_bytes=DEFAULT_MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes,
                        parser_options=parser_options)
        info = front.info
        if isinstance(front, DataParallelFront):
            on = f" on GPUs {' | '.join(front.gpus)}" if front.gpus else ""
            where = (f"{len(front.clients)} data-parallel replicas{on} (each with that KV cache), "
                     f"engine processes {', '.join(map(str, front.pids))}")
        elif isinstance(front, EngineClient):
            where = f"engine process {front.pid}"
        else:
            where = "engine in the server's process"
        shown_host = f"[{host}]" if ":" in host else host
        print(f"hotpath serve: model {name} ({info.model_dir}) on {info.device}, {info.dtype}; KV cache "
              f"{info.kv_capacity} tokens ({info.num_kv_blocks} blocks of {info.block_size}); "
              f"max_model_len {info.max_model_len}; {where}; API key "
              f"{'required' if api_key else 'not required'}", file=sys.stderr)
        print(f"hotpath serve: listening on http://{shown_host}:{port}/v1 (Ctrl-C to stop)",
              file=sys.stderr, flush=True)
        config = uvicorn.Config(
            app, host=host, port=port, log_level=uvicorn_log_level, access_log=access_log,
            timeout_graceful_shutdown=shutdown_timeout, lifespan="on",
        )
        if access_log:
            # uvicorn sets its access logger to the log level of its own messages, and writes
            # access lines at INFO: --uvicorn-log-level's default, warning, would hide them all
            access = logging.getLogger("uvicorn.access")
            access.setLevel(min(access.getEffectiveLevel(), logging.INFO))
        server = _Server(config)
        server.run()
    finally:
        front.shutdown()  # already done by the app's lifespan unless uvicorn failed or was forced out
    # a failed start (port in use) leaves `started` unset; uvicorn has logged why
    if not server.started:
        return 1
    print("hotpath serve: stopped", file=sys.stderr, flush=True)
    return 0


def _start_engine(engine_args: EngineArgs, engine_process: bool) -> EngineFront:
    """The engine front; loads the model before returning."""
    if getattr(engine_args, "data_parallel_size", 1) != 1:
        if not engine_process:
            raise ValueError("data parallelism runs each replica in an engine process of its own; "
                             "drop --no-engine-process")
        return DataParallelFront.launch(engine_args)
    if engine_process:
        return EngineClient.launch(engine_args)
    from hotpath.engine.async_engine import AsyncEngine
    from hotpath.engine.engine import Engine

    return AsyncEngine(Engine(engine_args))


def _default_model_name() -> str:
    from hotpath.assets import DEFAULT_MODEL

    return DEFAULT_MODEL
