"""The runner's own records of a step: the rows of tokens a forward is built from, and a step
queued on the device whose tokens are on their way to the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from hotpath.runner.plan import SampledToken
from hotpath.runner.seq_state import SeqState


@dataclass
class LaunchedStep:
    """A step queued on the device whose sampled tokens are on their way to the host."""

    scheduled: list[tuple[SeqState, int]]
    sampling: list[SeqState]  # the sequences that sample, in row order
    token_ids: torch.Tensor | None  # [len(sampling)] int64 on the device: the next step's inputs
    host: list[torch.Tensor | None]  # token ids, logprobs, top ids, top logprobs, copied to the host
    done: torch.cuda.Event | None  # recorded after those copies (None off CUDA: already there)
    out_slot: int | None = None  # the decode inputs' host ring row `host` views, freed on collect
    verified: dict[int, list[SampledToken]] | None = None  # a verify step's tokens, on the host
    # with an MTP head: the target's final hidden states of the step's tokens [tokens, hidden], and
    # where each sequence's are: (sequence, first position, tokens, first row in `hidden`)
    hidden: torch.Tensor | None = None
    hidden_rows: list[tuple[SeqState, int, int, int]] | None = None
    # a step whose sampling waits for its token mask (structured output): the sampling rows'
    # logits ([rows, vocab] fp32, a verify step's 1 + drafts rows a sequence) and whether it verifies
    logits: torch.Tensor | None = None
    verifies: bool = False

    def rows_of(self, seqs: list[SeqState]) -> list[int]:
        """The rows that sampled these sequences' tokens in this step."""
        rows = {s.seq_id: i for i, s in enumerate(self.sampling)}
        return [rows[s.seq_id] for s in seqs]


class Row(NamedTuple):
    """A sequence's tokens in one forward: `tokens` at positions first, first + 1, ... over its
    block table, logits wanted for the last `num_logits` of them."""

    seq: SeqState
    first: int
    tokens: list[int]
    num_logits: int
