"""The in-process engine front: an Engine driven from a thread of the server's process.

`hotpath serve` runs the engine in a process of its own (engine_client.py), so that HTTP handling
and the engine loop do not share a GIL; this front remains for tests and for `hotpath serve
--no-engine-process`, which measures what the separate process buys.

The Engine is single-threaded: only one thread may call add_request / step / abort_request. Here that
thread is a dedicated background thread running the loop

    drain commands (add, abort) -> engine.step() -> hand each RequestOutput to its stream

while the asyncio event loop (HTTP handling, tokenization, JSON, SSE) runs in the main thread. A model
step releases the GIL inside torch, so the server keeps answering during a long step on the CPU.

Commands reach the loop through a queue and a wake-up event, so the event loop never blocks on a step.
`add` carries a future that resolves once the engine accepted or rejected the request (the engine's
ValueError comes back to the caller as is).

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

from hotpath.engine.engine import Engine
from hotpath.engine.front import (
    EngineDeadError,
    EngineFront,
    EngineStats,
    FinishedHook,
    ModelInfo,
    RequestStream,
)
from hotpath.outputs import RequestOutput
from hotpath.sampling_params import SamplingParams

logger = logging.getLogger("hotpath")


class AsyncEngine(EngineFront):
    def __init__(self, engine: Engine, on_finished: FinishedHook | None = None) -> None:
        self.engine = engine
        self.info = ModelInfo.of(engine)
        self.tokenizer = engine.tokenizer
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
                self.stats.read_load(self.engine)
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
            deliveries.append((stream, out))
        if deliveries:
            # one wake-up of the event loop per step, not one per request
            self._loop.call_soon_threadsafe(self._deliver, deliveries)

    def _deliver(self, deliveries: list[tuple[RequestStream, RequestOutput]]) -> None:
        for stream, out in deliveries:
            if out.finished and self.on_finished is not None:
                self.on_finished(out)
            stream._put(out)

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
