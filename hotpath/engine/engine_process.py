"""The engine process: an Engine and its loop, fed through a pipe by the server (engine_client.py).

The process's life is tied to that pipe. It ignores SIGINT and SIGTERM (a Ctrl-C in the terminal
reaches the whole process group, and a service manager may signal every process of the service):
the server decides when it stops, after draining its requests, by sending SHUTDOWN. If the server
dies instead, the pipe reaches end-of-file and the loop returns, so no engine is left orphaned (while
the model loads, a thread watches the pipe for that).

Messages are tuples whose first item names them.
  server -> engine:  (ADD, request_id, prompt, SamplingParams, arrival_time)  (ABORT, request_id)
                     (SHUTDOWN,)
  engine -> server:  (READY, ModelInfo) once loaded, or (STARTUP_ERROR, the user's error or None,
                     "Type: message") before exiting;
                     then one (STEP, accepted ids, [(id, exception)] rejected, [RequestDelta], EngineStats)
                     per loop iteration; (FAILED, message) if a step raised, before exiting.
A STEP message carries every output of one engine step; the server reads all that wait when it wakes.
Detokenization and stop strings stay in the Engine, here; the server receives text.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
from multiprocessing.connection import Connection

import torch

from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.engine.front import EngineStats, ModelInfo
from hotpath.engine.output_deltas import DeltaEncoder

logger = logging.getLogger("hotpath")

ADD, ABORT, SHUTDOWN = "add", "abort", "shutdown"
READY, STARTUP_ERROR, STEP, FAILED = "ready", "startup_error", "step", "failed"
_PIPE_CLOSED = "pipe closed"  # the reader thread's word to the loop that the server is gone

# startup errors that are the user's (a bad path or flag): passed on as is, as the CLI reports them
USER_ERRORS = (ValueError, FileNotFoundError)


def run_engine_process(conn: Connection, args: EngineArgs, log_level: int) -> None:
    """The process's entry point (multiprocessing's target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tag = multiprocessing.current_process().name.removeprefix("hotpath-")  # engine, engine-dp1, ...
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s [{tag}]: %(message)s")
    loaded = threading.Event()
    threading.Thread(target=_exit_if_orphaned, args=(conn, loaded), name="orphan-watch", daemon=True).start()
    try:
        engine = Engine(args)
    except BaseException as e:
        if not isinstance(e, USER_ERRORS):
            logger.exception("the engine failed to start")
        _send_quietly(conn, (STARTUP_ERROR, e if isinstance(e, USER_ERRORS) else None,
                             f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None
    if engine.device.type != "cpu":
        # the model runs on the device; this process's host work is bookkeeping, and torch's
        # intra-op threads spinning after each small op would take the cores the server's
        # front end preprocesses images on
        torch.set_num_threads(1)
    try:
        loaded.set()
        conn.send((READY, ModelInfo.of(engine)))
        _serve_in_a_thread(engine, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the server is gone: nothing to answer to
    except BaseException as e:
        logger.exception("hotpath engine loop failed; no further requests will be served")
        _send_quietly(conn, (FAILED, f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None
    finally:
        engine.shutdown()  # a multi-process executor's workers end with the engine


def _serve(engine: Engine, conn: Connection) -> None:
    """drain commands -> engine.step() -> send the step's outputs, until SHUTDOWN or end-of-file."""
    encoder = DeltaEncoder()
    stats = EngineStats()
    commands = _read_in_a_thread(conn)
    while True:
        accepted: list[str] = []
        rejected: list[tuple[str, BaseException]] = []
        # idle: sleep until a command (or end-of-file) arrives
        pending = [commands.get()] if not engine.has_unfinished_requests() else []
        while pending or not commands.empty():
            command = pending.pop() if pending else commands.get_nowait()
            kind = command[0]
            if kind == ADD:
                _, request_id, prompt, params, arrival_time = command
                try:
                    engine.add_request(request_id, prompt, params, arrival_time)
                except Exception as e:  # the engine queues nothing when it raises here
                    # ValueError / TypeError are the caller's to see as is; anything else might not
                    # pickle, so it travels as text
                    error = e if isinstance(e, (ValueError, TypeError)) else RuntimeError(f"{type(e).__name__}: {e}")
                    rejected.append((request_id, error))
                    continue
                accepted.append(request_id)
                stats.prompt_tokens += len(engine.requests[request_id].prompt_token_ids)
            elif kind == ABORT:
                request_id = command[1]
                if request_id in engine.requests:
                    stats.num_aborted += 1
                engine.abort_request(request_id)
                encoder.forget(request_id)
            elif kind == _PIPE_CLOSED:
                raise command[1]
            else:  # SHUTDOWN: the server has drained what it meant to finish
                for request_id in list(engine.requests):
                    engine.abort_request(request_id)
                return
        deltas = []
        if engine.has_unfinished_requests():
            outputs = engine.step()
            stats.num_steps += 1
            for out in outputs:
                delta = encoder.encode(out)
                stats.generation_tokens += sum(len(seq[2]) for seq in delta[2])
                deltas.append(delta)
        stats.read_load(engine)
        conn.send((STEP, accepted, rejected, deltas, stats))


def _read_in_a_thread(conn: Connection) -> queue.SimpleQueue:
    """Reads the server's commands as they arrive, into a queue, on a thread of its own.

    The engine loop must never stop reading: with thousands of requests sent at once, the server's event loop sat in a blocking send of ADDs while the engine, between its reads,
    sat in a blocking send of STEP messages the event loop was not reading, and both waited
    forever. Reading here, the server's sends always drain, so it gets back to reading."""
    commands: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                command = conn.recv()
            except (EOFError, OSError) as e:
                commands.put((_PIPE_CLOSED, e if isinstance(e, EOFError) else EOFError(str(e))))
                return
            commands.put(command)
            if command[0] == SHUTDOWN:
                return

    threading.Thread(target=read, name="hotpath-commands", daemon=True).start()
    return commands


def _serve_in_a_thread(engine: Engine, conn: Connection) -> None:
    """Runs `_serve` in a thread of its own, as the engine ran inside the server before, and raises
    what it raised.

    Why not on the main thread: on a CPU whose cores were all busy (2 cores, other jobs), a tiny
    model's 300 steps took 9 to 20 s when the process's main thread drove them and 0.3 s from
    another thread. OpenMP's spin-waiting is the cause (OMP_WAIT_POLICY=PASSIVE brings the main
    thread to 0.6 s); why only the main thread's workers suffer was not found. On a GPU the
    in-process server stepped the engine from a thread too."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            _serve(engine, conn)
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run, name="hotpath-engine")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def _exit_if_orphaned(conn: Connection, loaded: threading.Event) -> None:
    """Ends the process if the server goes away while the model loads (minutes for a large one),
    when nothing else reads the pipe. The server sends nothing before READY, so the pipe turning
    readable then means end-of-file."""
    while not loaded.is_set():
        if conn.poll(1.0) and not loaded.is_set():
            os._exit(1)


def _send_quietly(conn: Connection, message: tuple) -> None:
    """Tells the server why this process stops, if it is still there to hear it."""
    try:
        conn.send(message)
    except OSError:
        pass  # the server is gone; this process's stderr (its log) still says why
