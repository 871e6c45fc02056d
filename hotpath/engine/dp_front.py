"""Data parallelism: `data_parallel_size` replicas of the engine behind one server, each an
EngineClient with an engine process (and GPUs) of its own, requests routed by prompt prefix
(dp_router.py).

Why replicas behind one front rather than one server per replica: clients see one endpoint, and
the router can send a prompt to the replica whose prefix cache already holds its start, which a
load balancer in front of separate servers cannot see.

GPUs: replica i sees GPUs [i*tp, (i+1)*tp) of those visible (CUDA_VISIBLE_DEVICES set in its
environment, tp = tensor_parallel_size), so inside a replica the engine and its tensor-parallel
workers number their GPUs from 0 as they do alone. On the CPU every replica runs on the CPU, with
an equal share of the cores for its OpenMP threads.

Failure: a replica whose engine process dies fails its own requests with 503 at once (as a lone
engine does); from then on /health answers 503 and new requests too, with that replica's error, so
that the operator (or an orchestrator watching /health) restarts the server. Requests in flight on
the other replicas finish.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
from dataclasses import fields, replace

from hotpath.args import EngineArgs
from hotpath.engine.dp_router import DEFAULT_LOAD_MARGIN, PrefixRouter
from hotpath.engine.engine_client import EngineClient, EngineStartupError, load_tokenizer_for
from hotpath.engine.front import (
    EngineDeadError,
    EngineFront,
    EngineStats,
    FinishedHook,
    ReplicaStats,
    RequestStream,
)
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.sampling_params import SamplingParams

logger = logging.getLogger("hotpath")

_MIN_TABLE_SIZE = 1024  # routing-table entries kept however small the replicas' caches are


class DataParallelFront(EngineFront):
    """Several engine processes behind the one interface the HTTP layer knows (front.py)."""

    def __init__(self, clients: list[EngineClient], tokenizer: object | None, gpus: list[str] | None,
                 load_margin: int = DEFAULT_LOAD_MARGIN) -> None:
        if not clients:
            raise ValueError("a data-parallel front needs at least one engine")
        self.clients = clients
        self.gpus = gpus  # the CUDA_VISIBLE_DEVICES of each replica; None on the CPU
        self.info = clients[0].info
        self.tokenizer = tokenizer
        capacity = max(_MIN_TABLE_SIZE, sum(c.info.num_kv_blocks for c in clients))
        self.router = PrefixRouter(len(clients), self.info.block_size, capacity, load_margin)
        self._on_finished: FinishedHook | None = None
        self._error: EngineDeadError | None = None
        self._started = False
        self._stopping = False

    # ---- life cycle ---------------------------------------------------------------------------
    @classmethod
    def launch(cls, args: EngineArgs) -> DataParallelFront:
        """Starts every replica's engine process at once and waits until all are loaded.

        If one fails, the others are stopped and its error is raised: the engine's own ValueError /
        FileNotFoundError for a bad model or flag, else EngineStartupError naming the replica."""
        size = getattr(args, "data_parallel_size", 1)
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"data_parallel_size must be a positive integer, got {size!r}")
        envs, gpus = replica_environments(args, size)
        # each engine is one replica: it must not see the data-parallel size as its own
        replica_args = (replace(args, data_parallel_size=1)
                        if "data_parallel_size" in {f.name for f in fields(args)} else args)
        spawned = []
        clients: dict[int, EngineClient] = {}
        try:
            for i, env in enumerate(envs):
                spawned.append(EngineClient.spawn(replica_args, name=f"hotpath-engine-dp{i}", env=env))
            waiting = dict(enumerate(spawned))
            while waiting:  # whichever replica answers first, so a failure is seen at once
                ready = multiprocessing.connection.wait(
                    [c for _, c in waiting.values()] + [p.sentinel for p, _ in waiting.values()])
                for i, (process, conn) in list(waiting.items()):
                    if conn in ready or process.sentinel in ready:
                        del waiting[i]
                        try:
                            clients[i] = EngineClient.connect(process, conn, replica_args, load_tokenizer=False)
                        except EngineStartupError as e:
                            raise EngineStartupError(f"data-parallel replica {i}: {e}") from None
            ordered = [clients[i] for i in range(size)]
            tokenizer = load_tokenizer_for(args, ordered[0].info)
        except BaseException:
            for client in clients.values():
                client.request_shutdown()
            for client in clients.values():
                client.shutdown()
            for process, conn in spawned:
                if process.is_alive():
                    process.kill()
                process.join()
                conn.close()
            raise
        return cls(ordered, tokenizer, gpus)

    def start(self) -> None:
        for client in self.clients:
            client.start()
        self._started = True

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Asks every replica to stop first, then waits for each, so they stop side by side."""
        self._stopping = True
        for client in self.clients:
            client.request_shutdown()
        for client in self.clients:
            client.shutdown(timeout)

    @property
    def is_running(self) -> bool:
        return self._started and not self._stopping and self.error is None

    @property
    def error(self) -> BaseException | None:
        """The first dead replica's error (kept once seen, so every answer names the same one)."""
        if self._error is None:
            for i, client in enumerate(self.clients):
                if client.error is not None:
                    self._error = EngineDeadError(f"data-parallel replica {i}: {client.error}")
                    break
        return self._error

    @property
    def pids(self) -> list[int]:
        return [client.pid for client in self.clients]

    @property
    def on_finished(self) -> FinishedHook | None:
        return self._on_finished

    @on_finished.setter
    def on_finished(self, hook: FinishedHook | None) -> None:
        self._on_finished = hook
        for client in self.clients:
            client.on_finished = hook

    # ---- requests -----------------------------------------------------------------------------
    async def add_request(
        self, request_id: str, prompt: str | list[int] | dict | ProcessedPrompt, params: SamplingParams
    ) -> RequestStream:
        """Routes the request (all n of its sequences) to one replica and queues it there."""
        if not self.is_running:
            raise EngineDeadError(str(self.error or "the engine is not running"))
        if any(client.holds(request_id) for client in self.clients):
            raise ValueError(f"request id {request_id!r} is already in use")
        hashes = self.router.block_hashes(self._routing_token_ids(prompt))
        route = self.router.choose(hashes, [client.num_in_flight for client in self.clients])
        # recorded before the engine accepts it, so that prompts arriving meanwhile with the same
        # prefix follow it; a rejected prompt leaves a stale hint, which costs a cache miss at most
        self.router.record(hashes, route)
        return await self.clients[route.replica].add_request(request_id, prompt, params)

    def abort(self, request_id: str) -> None:
        for client in self.clients:
            if client.holds(request_id):
                client.abort(request_id)

    def _routing_token_ids(self, prompt: str | list[int] | dict | ProcessedPrompt) -> list[int]:
        """The prompt's token ids, to hash. The server tokenizes every OpenAI request before it
        gets here, so these are mostly given; a text prompt is tokenized as the engine will (so a
        text and its ids route alike). Without a tokenizer a text is routed by load alone (the
        engine rejects it then anyway), and so is anything malformed, for the engine to reject.
        A prompt with images is hashed up to its first image: the prefix cache keys the blocks
        from there on by the images' content too, which these hashes do not see."""
        if isinstance(prompt, ProcessedPrompt):
            first = min((item.spans[0][0] for item in prompt.mm_items), default=len(prompt.prompt_token_ids))
            return prompt.prompt_token_ids[:first]
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True) if self.tokenizer is not None else []
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return []

    # ---- what the server reports --------------------------------------------------------------
    @property
    def stats(self) -> EngineStats:
        """The replicas' stats combined: counts summed, KV cache usage averaged."""
        return EngineStats.combined([client.stats for client in self.clients])

    def replicas(self) -> list[ReplicaStats]:
        return [ReplicaStats(routed=self.router.routed[i], prefix_routed=self.router.prefix_routed[i],
                             in_flight=client.num_in_flight, alive=client.error is None,
                             stats=client.stats)
                for i, client in enumerate(self.clients)]


def replica_environments(args: EngineArgs, size: int) -> tuple[list[dict[str, str]], list[str] | None]:
    """Each replica's environment, and the GPUs each sees (None on the CPU).

    On GPUs replica i gets CUDA_VISIBLE_DEVICES = the i-th group of tensor_parallel_size of the GPUs
    this process sees; on the CPU, OMP_NUM_THREADS = its share of the cores (unless set already),
    since each engine's OpenMP pool would otherwise take every core and the replicas' threads would
    spin against each other."""
    tp = getattr(args, "tensor_parallel_size", 1)
    device = args.device
    import torch

    on_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if not on_gpu:
        if device not in ("cpu", "auto"):
            raise ValueError(f"data_parallel_size {size}: --device {device!r} names one device; give "
                             "cuda (replica i takes GPUs i*tensor_parallel_size onwards), auto or cpu")
        if "OMP_NUM_THREADS" in os.environ:
            return [{} for _ in range(size)], None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = str(max(1, cores // size))
        return [{"OMP_NUM_THREADS": threads} for _ in range(size)], None
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    visible = ([d.strip() for d in visible_env.split(",") if d.strip()][:count] if visible_env
               else [str(i) for i in range(count)])
    needed = size * tp
    if needed > len(visible):
        raise ValueError(f"data_parallel_size {size} x tensor_parallel_size {tp} needs {needed} GPUs; "
                         f"{len(visible)} visible")
    gpus = [",".join(visible[i * tp:(i + 1) * tp]) for i in range(size)]
    return [{"CUDA_VISIBLE_DEVICES": g} for g in gpus], gpus
