"""The server's front on an engine process: `hotpath serve` runs the Engine in a child process.

Why a process: in one process, the engine loop (scheduling, sampling bookkeeping, detokenization,
CUDA graph launches) and HTTP handling (parsing, tokenization, JSON, SSE) share one GIL, which
cost the server's TPOT much of the engine's speed under many streams (docs/decisions.md, server).
The child runs engine_process.py's loop; this side keeps the HTTP layer's interface
(front.py), so app.py and serving.py do not know where the engine runs.

The transport is a multiprocessing Pipe (a Unix socket pair) with pickled messages, spawned (CUDA
cannot be forked into). It is read on the event loop itself (`add_reader`): one STEP message per
engine step carries every output of that step, and the server reads all that wait when it wakes, so
it needs no thread. Commands (add, abort) are written as they come; a write waits only when the
socket buffer (about 200 KB) is full, which the engine process's reader thread empties.

A dead engine process is seen at once: its end of the pipe reads end-of-file and its sentinel turns
readable. Every pending and open request then fails with EngineDeadError (HTTP 503 with the exit
code), new ones too, and /health answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from hotpath.args import EngineArgs
from hotpath.engine.engine_process import (
    ABORT,
    ADD,
    FAILED,
    READY,
    SHUTDOWN,
    STEP,
    run_engine_process,
)
from hotpath.engine.front import EngineDeadError, EngineFront, EngineStats, ModelInfo, RequestStream
from hotpath.engine.output_deltas import OutputAssembler, RequestDelta
from hotpath.sampling_params import SamplingParams

logger = logging.getLogger("hotpath")
# a bound on the messages read in one wake-up, so that a flood of them cannot starve the writers
_MAX_MESSAGES_A_WAKE = 64


class EngineStartupError(RuntimeError):
    """The engine process could not load the engine; the message says why."""


class EngineClient(EngineFront):
    def __init__(self, process: BaseProcess, conn: Connection, info: ModelInfo,
                 tokenizer: object | None) -> None:
        self.process = process
        self.info = info
        self.tokenizer = tokenizer
        self.on_finished = None
        self.stats = EngineStats()
        self.error: BaseException | None = None
        self._conn = conn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[str, tuple[asyncio.Future, RequestStream]] = {}  # sent, not yet accepted
        self._streams: dict[str, RequestStream] = {}
        self._assembler = OutputAssembler()
        self._failure: str | None = None  # what a FAILED message said
        self._stopping = False
        self._stopped = False

    @property
    def pid(self) -> int:
        return self.process.pid

    # ---- life cycle ---------------------------------------------------------------------------
    @classmethod
    def launch(cls, args: EngineArgs) -> EngineClient:
        """Starts the engine process and waits until its engine is loaded.

        Raises the engine's own ValueError / FileNotFoundError for a bad model or flag, and
        EngineStartupError for anything else that stops it (its traceback is in its log)."""
        process, conn = cls.spawn(args)
        return cls.connect(process, conn, args)

    @staticmethod
    def spawn(args: EngineArgs, name: str = "hotpath-engine",
              env: dict[str, str] | None = None) -> tuple[BaseProcess, Connection]:
        """Starts an engine process without waiting for it, so that several load at once (data
        parallelism); `env` is set in its environment (which GPUs it sees). `connect` then waits."""
        ctx = multiprocessing.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        process = ctx.Process(target=run_engine_process, name=name,
                              args=(child_conn, args, logging.getLogger().getEffectiveLevel()))
        # ignored signals stay ignored through exec, so the child ignores Ctrl-C from its first
        # instruction, not only once its imports are done
        with _signals_ignored(signal.SIGINT, signal.SIGTERM), _environment(env or {}):
            process.start()
        child_conn.close()  # else this process's copy would hold the pipe open after the child died
        return process, conn

    @classmethod
    def connect(cls, process: BaseProcess, conn: Connection, args: EngineArgs,
                load_tokenizer: bool = True) -> EngineClient:
        """Waits until the spawned process's engine is loaded; on any failure kills the process.

        `load_tokenizer=False` leaves `tokenizer` None: data-parallel replicas share one."""
        try:
            info = _wait_until_ready(process, conn)
            tokenizer = load_tokenizer_for(args, info) if load_tokenizer else None
        except BaseException:  # a startup error (the child is exiting) or an interrupt: no waiting
            process.kill()
            process.join()
            conn.close()
            raise
        return cls(process, conn, info, tokenizer)

    def start(self) -> None:
        """Starts reading the engine's messages on the running event loop."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        self._loop.add_reader(self.process.sentinel, self._on_exit)
        # uvloop (uvicorn's loop where installed) makes a watched fd non-blocking; the pipe's
        # messages are sent and read whole, so it must block: a send to a full socket buffer
        # raised BlockingIOError under 64 streams on the GPU, and a half-arrived message would too
        os.set_blocking(self._conn.fileno(), True)

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stops the engine process (it aborts what is left) and fails every open stream."""
        if self._stopped:
            return
        self.request_shutdown()
        self._stopped = True
        _stop(self.process, self._conn, timeout)

    def request_shutdown(self) -> None:
        """Tells the engine process to stop without waiting for it, so that several stop at once
        (data parallelism); `shutdown` then waits."""
        if self._stopping:
            return
        self._stopping = True
        self._remove_readers()  # the child's end-of-file from here on is no death
        if self.error is None:
            with contextlib.suppress(OSError):
                self._conn.send((SHUTDOWN,))
            self._fail_all(EngineDeadError("the engine stopped"))

    @property
    def is_running(self) -> bool:
        return self._loop is not None and self.error is None and not self._stopping

    @property
    def num_in_flight(self) -> int:
        """Requests sent and not yet finished or aborted (a data-parallel router's load)."""
        return len(self._pending) + len(self._streams)

    def holds(self, request_id: str) -> bool:
        """Whether the request was sent here and has not finished or been aborted."""
        return request_id in self._pending or request_id in self._streams

    # ---- requests -----------------------------------------------------------------------------
    async def add_request(
        self, request_id: str, prompt: str | list[int] | dict, params: SamplingParams
    ) -> RequestStream:
        if not self.is_running:
            raise EngineDeadError(str(self.error or "the engine is not running"))
        if request_id in self._pending or request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id, self)
        accepted = self._loop.create_future()
        self._pending[request_id] = (accepted, stream)
        try:
            # stamped here, so TTFT counts the wait for the engine's next step boundary
            self._conn.send((ADD, request_id, prompt, params, time.monotonic()))
        except OSError as e:
            self._died(f"the pipe to it failed: {type(e).__name__}: {e}")
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)  # it may have been accepted after all
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._streams.pop(request_id, None)
        self._assembler.forget(request_id)
        if self.is_running:
            try:
                self._conn.send((ABORT, request_id))
            except OSError as e:
                self._died(f"the pipe to it failed: {type(e).__name__}: {e}")

    # ---- messages from the engine process -----------------------------------------------------
    def _on_readable(self) -> None:
        """Handles the messages waiting, then returns to the loop, which runs the streams' writers.

        Reading all that waits (not one message a wake-up) is what lets a server behind its engine
        catch up: each stream is then read once for several steps' tokens, one chunk to its client
        instead of one a step, so the cost a token falls as the load rises."""
        for _ in range(_MAX_MESSAGES_A_WAKE):
            try:
                message = self._conn.recv()
            except (EOFError, OSError) as e:
                self._died(f"the pipe from it failed: {type(e).__name__}: {e}" if str(e) else "its pipe closed")
                return
            self._handle(message)
            if self.error is not None or self._stopping or not self._conn.poll():
                return

    def _on_exit(self) -> None:
        while self.error is None and self._conn.poll():  # what it sent before exiting comes first
            self._on_readable()
        self._died()

    def _handle(self, message: tuple) -> None:
        if message[0] == STEP:
            _, accepted, rejected, deltas, self.stats = message
            for request_id in accepted:
                future, stream = self._pending.pop(request_id, (None, None))
                if future is not None:  # not aborted while it travelled
                    self._streams[request_id] = stream
                    future.set_result(None)
            for request_id, error in rejected:
                future, _ = self._pending.pop(request_id, (None, None))
                if future is not None:
                    future.set_exception(error)
            self._deliver(deltas)
        elif message[0] == FAILED:
            self._failure = message[1]
        else:
            logger.error("unexpected message from the engine process: %r", message[0])

    def _deliver(self, deltas: list[RequestDelta]) -> None:
        for delta in deltas:
            stream = self._streams.get(delta[0])
            if stream is None:  # aborted after the engine produced this
                continue
            out = self._assembler.apply(delta)
            if out.finished:
                del self._streams[out.request_id]
                if self.on_finished is not None:
                    out = out.output()
                    self.on_finished(out)
            stream._put(out)

    def _died(self, pipe_error: str | None = None) -> None:
        """The engine process is gone (or its pipe is): fail everything, now and from now on."""
        if self.error is not None or self._stopping:
            return
        self._remove_readers()
        self.process.join(1.0)  # end-of-file can come a moment before the exit status
        if self.process.is_alive():  # its pipe failed yet it lives on: of no use any more
            logger.error("hotpath serve: the engine process is alive but %s; stopping it",
                         pipe_error or "its pipe failed")
            self.process.kill()
            self.process.join()
            why = f"{pipe_error or 'its pipe failed'}; stopped by the server"
        else:
            why = _exit_description(self.process.exitcode)
        if self._failure is not None:
            why = f"{self._failure}; {why}"
        error = EngineDeadError(f"engine process died ({why}); restart the server")
        logger.error("hotpath serve: %s", error)
        self.error = error
        self._fail_all(error)

    def _fail_all(self, error: EngineDeadError) -> None:
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for stream in self._streams.values():
            stream._fail(error)
        self._pending.clear()
        self._streams.clear()

    def _remove_readers(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._conn.fileno())
            self._loop.remove_reader(self.process.sentinel)


def load_tokenizer_for(args: EngineArgs, info: ModelInfo) -> object | None:
    """The server's copy of the engine's tokenizer, for /tokenize, chat templates and prompt
    checks (the engine process has its own); None with skip_tokenizer_init."""
    if args.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(args.tokenizer or info.model_dir)


def _wait_until_ready(process: BaseProcess, conn: Connection) -> ModelInfo:
    multiprocessing.connection.wait([conn, process.sentinel])
    try:
        message = conn.recv()
    except EOFError:
        process.join(5.0)
        raise EngineStartupError(
            f"the engine process exited while loading ({_exit_description(process.exitcode)})"
        ) from None
    if message[0] == READY:
        return message[1]
    _, user_error, text = message
    if user_error is not None:
        raise user_error
    raise EngineStartupError(f"the engine process failed to start: {text}")


def _stop(process: BaseProcess, conn: Connection, timeout: float | None) -> None:
    """Waits for the process to end, kills it if it does not, and closes the pipe."""
    process.join(timeout)
    if process.is_alive():
        logger.warning("the engine process did not stop in %ss; killing it", timeout)
        process.kill()
        process.join()
    conn.close()


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}, exit code {exitcode}"
    return f"exit code {exitcode}"


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """Sets environment variables for a child about to be spawned, then restores them."""
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _signals_ignored(*signals: signal.Signals):
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
