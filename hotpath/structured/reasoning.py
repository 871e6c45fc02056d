"""A constraint that waits for the reasoning: with a reasoning parser set (`--reasoning-parser`, as
vLLM's engine takes it), a constrained sequence's grammar starts after its `<think>...</think>`
block, so a thinking model reasons freely and then answers in the constraint (a required tool
call, a JSON schema), as vLLM's structured output does with a reasoner.

Where the reply starts is read from the prompt, as the server's reasoning parser reads it: a prompt
that ends in `<think>` (a template that pre-fills it) starts the reply inside the block; any other
starts it undecided, where the model may open a block with `<think>` (a one-token tag) or answer
at once. Inside the block every token is allowed and the grammar sees nothing; the token that
closes it (`</think>`) ends the wait, and the grammar starts at the next token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotpath.engine.sequence import Sequence

REASONING_TAGS = {"qwen3": ("<think>", "</think>")}  # --reasoning-parser names (vLLM's)

# a sequence's phase: in the block, before knowing whether one opens, in the grammar's answer
REASONING, UNDECIDED, ANSWER = "reasoning", "undecided", "answer"


@dataclass
class ReasoningGate:
    start: str
    end: str
    start_id: int | None  # the tag's token where it is one token, else None (matched as text)
    end_id: int | None

    @classmethod
    def for_parser(cls, name: str, tokenizer) -> ReasoningGate:
        if name not in REASONING_TAGS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_TAGS)}, got {name!r}")
        if tokenizer is None:
            raise ValueError("reasoning_parser needs the tokenizer (skip_tokenizer_init is set)")
        start, end = REASONING_TAGS[name]
        return cls(start, end, _one_token(tokenizer, start), _one_token(tokenizer, end))

    def first_phase(self, tokenizer, prompt_token_ids: list[int]) -> str:
        tail = tokenizer.decode(prompt_token_ids[-8:])
        return REASONING if tail.rstrip().endswith(self.start) else UNDECIDED

    def after(self, seq: Sequence, phase: str, token_id: int, reasoning_from: int) -> str:
        """The phase after seq took token_id (seq.text already holds its text)."""
        if phase == UNDECIDED:
            opens = token_id == self.start_id if self.start_id is not None else \
                seq.text.lstrip().startswith(self.start)
            return REASONING if opens else ANSWER
        closes = token_id == self.end_id if self.end_id is not None else \
            seq.text.find(self.end, reasoning_from) != -1
        return ANSWER if closes else REASONING


def _one_token(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
