"""The async front on the engine, for the server: one engine loop, one stream per request.

The Engine is single-threaded: only one thread may call add_request / step / abort_request. Here that
thread is a dedicated background thread running the loop

    drain commands (add, abort) -> engine.step() -> hand each RequestOutput to its stream

while the asyncio event loop (HTTP handling, tokenization, JSON, SSE) runs in the main thread. A model
step releases the GIL inside torch, so the server keeps answering during a long step on the CPU.

Commands reach the loop through a queue and a wake-up event, so the event loop never blocks on a step.
`add` carries a future that resolves once the engine accepted or rejected the request (the engine's
ValueError comes back to the caller as is).

Outputs are cumulative (the whole text so far), so a stream keeps only the newest one: a client that
reads slower than the engine produces sees fewer, larger deltas, and nothing queues up without bound.

A consumer that stops iterating (client disconnect, cancelled task) aborts its request in the
generator's `finally`; the abort is applied before the next step, which frees the KV blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from hotpath.engine.engine import Engine
from hotpath.outputs import RequestOutput
from hotpath.sampling_params import SamplingParams

logger = logging.getLogger("hotpath")


class EngineDeadError(RuntimeError):
    """The engine loop stopped (an error in a step, or shutdown); no request can be served."""


@dataclass
class EngineStats:
    """A snapshot of the engine's load, refreshed by the loop after every iteration."""

    num_running: int = 0  # requests with at least one running sequence
    num_waiting: int = 0  # requests whose sequences all wait (queued or preempted)
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens of every accepted request
    generation_tokens: int = 0  # tokens generated, aborted requests included
    num_steps: int = 0
    num_aborted: int = 0  # requests aborted before they finished (client gone, shutdown)


class RequestStream:
    """The outputs of one request, as an async iterator; the last one has `finished` set.

    Filled from the engine thread (through the event loop's call_soon_threadsafe), read on the event
    loop. Closing it before the last output aborts the request."""

    def __init__(self, request_id: str, front: "AsyncEngine") -> None:
        self.request_id = request_id
        self._front = front
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.finished = False
        self.closed = False

    # engine side (run on the event loop)
    def _put(self, out: RequestOutput) -> None:
        self._latest = out
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    # consumer side
    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self.closed:
            raise StopAsyncIteration
        await self._ready.wait()
        self._ready.clear()
        if self._error is not None:
            self.closed = True
            raise self._error
        out = self._latest
        if out.finished:
            self.finished = True
        return out

    def close(self) -> None:
        """Aborts the request unless it finished; safe to call more than once."""
        if not self.finished and not self.closed:
            self._front.abort(self.request_id)
        self.closed = True

    async def aclose(self) -> None:
        self.close()


# Called in the engine thread with each finished (not aborted) request's final output.
FinishedHook = Callable[[RequestOutput], None]


class AsyncEngine:
    def __init__(self, engine: Engine, on_finished: FinishedHook | None = None) -> None:
        self.engine = engine
        self.on_finished = on_finished
        self.stats = EngineStats()
        self.error: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}  # touched only by the engine thread
        self._num_generated: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False  # set, under _submit_lock, once the loop takes no more commands
        self._submit_lock = threading.Lock()

    # ---- life cycle (event loop side) -------------------------------------------------------
    def start(self) -> None:
        """Starts the engine thread; call from the event loop that will consume the streams."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="hotpath-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Aborts what is left, stops the engine thread and waits for it."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- requests (event loop side) --------------------------------------------------------
    async def add_request(
        self, request_id: str, prompt: str | list[int] | dict, params: SamplingParams
    ) -> RequestStream:
        """Queues the request; returns its output stream once the engine accepted it.

        Raises the engine's ValueError when it rejects the request, EngineDeadError when no engine
        loop runs."""
        stream = RequestStream(request_id, self)
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        # stamped here, so TTFT counts the wait for the engine thread's next step boundary
        command = ("add", request_id, prompt, params, time.monotonic(), stream, accepted)
        if not self.is_running or not self._submit(command):
            raise EngineDeadError("the engine is not running")
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:
            self.abort(request_id)  # it may have been accepted after all
            raise
        return stream

    async def generate(
        self, request_id: str, prompt: str | list[int] | dict, params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """add_request + iterate; leaving the loop early aborts the request."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        self._submit(("abort", request_id))

    def _submit(self, command: tuple) -> bool:
        """Queues a command for the engine thread; False once the loop has stopped."""
        with self._submit_lock:
            if self._closed:
                return False
            self._commands.put(command)
        self._wake.set()
        return True

    # ---- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                if not self.engine.has_unfinished_requests() and self._commands.empty():
                    self._wake.wait()
                self._wake.clear()
                self._drain_commands()
                if self._stopping:
                    break
                outputs = []
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    self.stats.num_steps += 1
                # stats first, so a consumer woken by an output never sees older stats
                self._refresh_stats()
                self._dispatch(outputs)
        except BaseException as e:  # a failed step leaves the engine in an unknown state
            logger.exception("hotpath engine loop failed; no further requests will be served")
            self.error = e
        finally:
            self._stop_all()

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, prompt, params, arrival_time, stream, accepted = command
                try:
                    self.engine.add_request(request_id, prompt, params, arrival_time)
                except BaseException as e:
                    accepted.set_exception(e)
                    continue
                self._streams[request_id] = stream
                self._num_generated[request_id] = 0
                self.stats.prompt_tokens += len(self.engine.requests[request_id].prompt_token_ids)
                accepted.set_result(None)
            else:
                _, request_id = command
                if request_id in self.engine.requests:
                    self.stats.num_aborted += 1
                self.engine.abort_request(request_id)
                self._streams.pop(request_id, None)
                self._num_generated.pop(request_id, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        deliveries = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            generated = sum(len(o.token_ids) for o in out.outputs)
            self.stats.generation_tokens += generated - self._num_generated[out.request_id]
            self._num_generated[out.request_id] = generated
            if out.finished:
                del self._streams[out.request_id]
                del self._num_generated[out.request_id]
                if self.on_finished is not None:
                    self.on_finished(out)
            deliveries.append((stream, out))
        if deliveries:
            # one wake-up of the event loop per step, not one per request
            self._loop.call_soon_threadsafe(_deliver, deliveries)

    def _refresh_stats(self) -> None:
        sched = self.engine.scheduler
        running = {s.request_id for s in sched.running}
        waiting = {s.request_id for s in sched.waiting} - running
        kv = self.engine.kv_cache
        s = self.stats
        s.num_running, s.num_waiting = len(running), len(waiting)
        s.kv_cache_usage = kv.usage
        s.prefix_queried_tokens, s.prefix_hit_tokens = kv.prefix_queried_tokens, kv.prefix_hit_tokens
        s.num_preemptions = sched.num_preemptions

    def _stop_all(self) -> None:
        """Aborts every request still in the engine and fails every open stream and pending add."""
        error = EngineDeadError("the engine stopped" if self.error is None else f"the engine failed: {self.error}")
        for request_id in list(self.engine.requests):
            try:
                self.engine.abort_request(request_id)
            except Exception:  # the engine may be broken already; the streams still need failing
                logger.exception("abort of %s during shutdown failed", request_id)
        with self._submit_lock:
            self._closed = True
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                command[-1].set_exception(error)
        for stream in self._streams.values():
            self._loop.call_soon_threadsafe(stream._fail, error)
        self._streams.clear()


def _deliver(deliveries: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in deliveries:
        stream._put(out)
