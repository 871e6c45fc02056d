"""A sequence: one prompt and one stream of generated tokens (a request with n > 1 owns n)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hotpath.engine.detokenizer import DetokenizerState
from hotpath.outputs import Logprob
from hotpath.runner.seq_state import SeqState

if TYPE_CHECKING:
    from hotpath.structured.grammars import SeqGrammar


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(kw_only=True)
class Sequence(SeqState):
    """The engine's sequence: the runner's view of it (SeqState) and what only the engine keeps."""

    request_id: str
    index: int  # which of the request's n outputs this is
    # per generated token, when asked for: {token_id: Logprob} for the sampled token and the top-n
    output_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of its full cached blocks
    # whether the workers hold it (a SeqState each), and the leading block_table entries they hold
    # as they are (a step plan sends the rest)
    on_workers: bool = False
    num_blocks_sent: int = 0
    # hybrid prefix caching (engine/state_snapshots.py): its pending snapshot and the boundary it holds
    snapshot: int | None = None
    snapshot_boundary: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hits at first scheduling, for metrics
    first_scheduled_time: float | None = None  # time.monotonic() when first admitted, for metrics
    num_drafted: int = 0  # drafts verified so far, for metrics
    num_accepted: int = 0  # of which accepted
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    text: str = ""
    detok: DetokenizerState = field(default_factory=DetokenizerState)
    grammar: SeqGrammar | None = None  # structured output: its constraint's compile and matcher

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
