"""What the runner knows of a sequence: its tokens, where its cache is, this step's drafts.

The engine's `Sequence` (engine/sequence.py) extends this with what only the engine needs (text,
logprobs, stop reasons, prefix-cache hashes). The runner never sees a `Sequence`: a worker keeps a
`SeqState` per running sequence, filled from the step plans the engine sends (runner/plan.py) and
from the tokens it samples itself, so the two sides hold the same token lists without sending them
every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hotpath.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotpath.multimodal.inputs import MultiModalItem
    from hotpath.multimodal.positions import MropeLayout


@dataclass(kw_only=True)
class SeqState:
    seq_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # params.max_tokens, capped by the context limit
    stop_token_ids: set[int]  # EOS (unless ignore_eos) + params.stop_token_ids
    generator: torch.Generator | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (or queued on the device)
    # tokens sampled by launched steps whose ids have not reached the host yet (async scheduling:
    # the next step may be launched before this one's tokens are collected); counted by
    # num_tokens, absent from output_token_ids
    num_pending_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None  # its linear-attention layers' state slot (hybrid models)
    # hybrid prefix caching: the snapshot its slot starts from this step (a prefix hit), and where
    # this step saves one: (tokens into this step's chunk, snapshot id)
    restore_snapshot: int | None = None
    save_at: tuple[int, int] | None = None
    # speculative decoding: this step's drafts, fed after its last token and verified by the
    # step; the distribution each was drawn from ([k, vocab], None: point mass)
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None
    num_draft_computed: int = 0  # tokens whose draft-model (or MTP head) K/V are in the cache
    # image-text models: the prompt's images and videos in prompt order, and (worker side) their
    # tokens' mRoPE position ids; past the prompt's last visual token a token's id is its index
    # plus rope_delta
    mm_items: list[MultiModalItem] = field(default_factory=list)
    mrope: MropeLayout | None = None
    rope_delta: int = 0
    num_prompt_tokens: int = field(init=False)  # len(prompt_token_ids), which never changes

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Every token the sequence has, on the host or still pending on the device."""
        return self.num_prompt_tokens + len(self.output_token_ids) + self.num_pending_tokens

    @property
    def num_known_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

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

    def token_at(self, position: int) -> int:
        n = self.num_prompt_tokens
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]


def is_plain_greedy(seq: SeqState) -> bool:
    """Whether seq's next token is the plain argmax of its logits: greedy, no penalties, no
    min_tokens suppression in force, no top logprobs asked for and no structured output. Such a row
    needs nothing the Sampler adds, so the decode graph's own argmax (and its logprob) is its token."""
    p = seq.params
    return (
        p.greedy
        and p.structured_outputs is None
        and not p.logprobs  # None or 0: only the sampled token's logprob
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and not (p.min_tokens and seq.stop_token_ids and seq.num_output_tokens < p.min_tokens)
    )
