"""A sequence: one prompt and one stream of generated tokens (a request with n > 1 owns n)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from hotpath.engine.detokenizer import DetokenizerState
from hotpath.outputs import Logprob
from hotpath.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    request_id: str
    index: int  # which of the request's n outputs this is
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # params.max_tokens, capped by the context limit
    stop_token_ids: set[int]  # EOS (unless ignore_eos) + params.stop_token_ids
    generator: torch.Generator | None = None
    output_token_ids: list[int] = field(default_factory=list)
    # per generated token, when asked for: {token_id: Logprob} for the sampled token and the top-n
    output_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (or queued on the device)
    # tokens sampled by launched steps whose ids have not reached the host yet (async scheduling:
    # the next step may be launched before this one's tokens are collected); counted by
    # num_tokens, absent from output_token_ids
    num_pending_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of its full cached blocks
    state_slot: int | None = None  # its linear-attention layers' state slot (hybrid models)
    # hybrid prefix caching (engine/state_snapshots.py): its pending snapshot and the boundary it
    # holds; the snapshot its slot starts from (a prefix hit), and where this step saves one
    snapshot: int | None = None
    snapshot_boundary: int = 0
    restore_snapshot: int | None = None
    save_at: tuple[int, int] | None = None  # (tokens into this step's chunk, snapshot id)
    num_cached_prompt_tokens: int = 0  # prefix-cache hits at first scheduling, for metrics
    # speculative decoding (engine/spec): this step's drafts, fed after its last token and
    # verified by the step; the distribution each was drawn from ([k, vocab], None: point mass)
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None
    num_draft_computed: int = 0  # tokens whose draft-model K/V are in the cache
    num_drafted: int = 0  # drafts verified so far, for metrics
    num_accepted: int = 0  # of which accepted
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    text: str = ""
    detok: DetokenizerState = field(default_factory=DetokenizerState)

    @property
    def num_tokens(self) -> int:
        """Every token the sequence has, on the host or still pending on the device."""
        return self.num_known_tokens + self.num_pending_tokens

    @property
    def num_known_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens, the pending ones included."""
        return len(self.output_token_ids) + self.num_pending_tokens

    @property
    def all_token_ids(self) -> list[int]:
        """The tokens on the host (pending ones are not)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_decoding(self) -> bool:
        """Whether its next step feeds only its newest token (not a prefill or its chunk)."""
        return self.num_computed_tokens + 1 == self.num_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def token_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]
