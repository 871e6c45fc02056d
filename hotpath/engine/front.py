"""What the server calls to run requests: the engine front's interface and the types it hands out.

Three fronts implement it: `EngineClient` (engine_client.py), which drives an Engine in a process of
its own and is what `hotpath serve` uses, `DataParallelFront` (dp_front.py), which routes requests
over several EngineClients (`--data-parallel-size`), and `AsyncEngine` (async_engine.py), which
drives one from a thread of the server's process (tests, and `--no-engine-process` for comparisons). The HTTP layer
sees only this file's names, so it is the same over either.

Everything here runs on the server's asyncio event loop unless a method says otherwise.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from hotpath.outputs import RequestOutput
from hotpath.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotpath.engine.engine import Engine
    from hotpath.engine.output_deltas import AssembledRequest
    from hotpath.multimodal.inputs import ProcessedPrompt


class EngineDeadError(RuntimeError):
    """The engine stopped (shutdown, a failed step, a dead engine process); no request can be served."""


@dataclass
class EngineStats:
    """A snapshot of the engine's load, refreshed after every engine iteration."""

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
    # speculative decoding: verify rows, drafts proposed and accepted, accepted by draft position
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()

    def read_load(self, engine: Engine) -> None:
        """Copies the gauges the scheduler and the KV cache keep; call from the engine's thread."""
        sched = engine.scheduler
        running = {s.request_id for s in sched.running}
        waiting = {s.request_id for s in sched.waiting} - running
        kv = engine.kv_cache
        self.num_running, self.num_waiting = len(running), len(waiting)
        self.kv_cache_usage = kv.usage
        self.prefix_queried_tokens, self.prefix_hit_tokens = kv.prefix_queried_tokens, kv.prefix_hit_tokens
        self.num_preemptions = sched.num_preemptions
        spec = engine.spec_stats
        if spec is not None:  # None without speculative decoding
            self.spec_num_drafts, self.spec_num_draft_tokens = spec.num_drafts, spec.num_draft_tokens
            self.spec_num_accepted_tokens = spec.num_accepted_tokens
            self.spec_accepted_per_pos = tuple(spec.accepted_per_pos)

    @classmethod
    def combined(cls, parts: list[EngineStats]) -> EngineStats:
        """Several engines' stats as one (data-parallel replicas): counts and counters add up,
        the KV cache usage is their mean (each replica has a cache of the same size)."""
        total = cls()
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if f.name == "kv_cache_usage":
                value = sum(values) / len(values) if values else 0.0
            elif f.name == "spec_accepted_per_pos":
                width = max((len(v) for v in values), default=0)
                value = tuple(sum(v[i] for v in values if i < len(v)) for i in range(width))
            else:
                value = sum(values)
            setattr(total, f.name, value)
        return total


@dataclass(frozen=True)
class ReplicaStats:
    """One data-parallel replica as /metrics shows it: what the router sent it, and its engine's."""

    routed: int  # requests the router sent to it
    prefix_routed: int  # of those, how many went to it for a cached prefix of their prompt
    in_flight: int  # requests sent and not yet finished
    alive: bool
    stats: EngineStats


@dataclass(frozen=True)
class ModelInfo:
    """What the server needs to know of the loaded engine (limits, the startup line)."""

    model_dir: str
    device: str
    dtype: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int

    @classmethod
    def of(cls, engine: Engine) -> ModelInfo:
        return cls(
            model_dir=str(engine.model_dir), device=str(engine.device),
            dtype=str(engine.dtype).removeprefix("torch."), max_model_len=engine.config.max_model_len,
            vocab_size=engine.model_config.vocab_size, block_size=engine.config.block_size,
            num_kv_blocks=engine.kv_cache.num_blocks,
        )

    @property
    def kv_capacity(self) -> int:
        """Tokens the KV cache holds."""
        return self.num_kv_blocks * self.block_size


class RequestStream:
    """The outputs of one request, as an async iterator; the last one has `finished` set.

    Outputs are cumulative (the whole text so far), so the stream keeps only the newest one: a
    client that reads slower than the engine produces sees fewer, larger deltas, and nothing queues
    up without bound. The front may put an AssembledRequest (engine_client.py's), whose output is
    built when it is read. Closing the stream before the last output aborts the request."""

    def __init__(self, request_id: str, front: EngineFront) -> None:
        self.request_id = request_id
        self._front = front
        self._latest: RequestOutput | AssembledRequest | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.finished = False
        self.closed = False

    # the front's side
    def _put(self, out: RequestOutput | AssembledRequest) -> None:
        self._latest = out
        self._ready.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    # the consumer's side
    def __aiter__(self) -> RequestStream:
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
        if not isinstance(out, RequestOutput):
            out = out.output()
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


# Called with each finished (not aborted) request's final output, once.
FinishedHook = Callable[[RequestOutput], None]


class EngineFront(ABC):
    """One engine loop behind an asyncio interface: one stream per request."""

    info: ModelInfo
    tokenizer: object | None  # a transformers tokenizer, None with skip_tokenizer_init
    stats: EngineStats
    on_finished: FinishedHook | None
    error: BaseException | None  # why the engine stopped serving, once it has

    @abstractmethod
    def start(self) -> None:
        """Connects the front to the running event loop, which will consume the streams."""

    @abstractmethod
    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stops the engine and fails every open stream; safe to call more than once."""

    @property
    @abstractmethod
    def is_running(self) -> bool:
        """Whether new requests can be served."""

    @abstractmethod
    async def add_request(
        self, request_id: str, prompt: str | list[int] | dict | ProcessedPrompt, params: SamplingParams
    ) -> RequestStream:
        """Queues the request; returns its output stream once the engine accepted it. A
        ProcessedPrompt (images preprocessed by the server) goes to the engine as it is.

        Raises the engine's ValueError when it rejects the request, EngineDeadError when no engine
        serves."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Stops the request and frees its KV blocks before the engine's next step."""

    def replicas(self) -> list[ReplicaStats]:
        """Each data-parallel replica's share, for /metrics; empty for a front of one engine."""
        return []

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
