"""Acceptance counters of speculative decoding, engine-wide (the server's /metrics reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    num_speculative_tokens: int
    num_drafts: int = 0  # verify rows: a sequence's drafts checked in one step
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # by draft position (0 = the first draft): how often one was proposed there, and accepted
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.drafted_per_pos = [0] * self.num_speculative_tokens
        self.accepted_per_pos = [0] * self.num_speculative_tokens

    def record(self, drafts: int, accepted: int) -> None:
        """One sequence's verify step: `drafts` proposed, the first `accepted` of them kept."""
        self.num_drafts += 1
        self.num_draft_tokens += drafts
        self.num_accepted_tokens += accepted
        for i in range(drafts):
            self.drafted_per_pos[i] += 1
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verify step emitted on average (accepted drafts + 1)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
