"""Incremental detokenization: each step decodes a short window of tokens, not the whole output.

Decoding `ids[prefix_offset:]` and `ids[prefix_offset:read_offset]` and taking the difference gives
the new text with the same leading-space and merge behaviour as a full decode; a window that ends in
an incomplete UTF-8 sequence yields nothing until the next token completes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetokenizerState:
    prefix_offset: int = 0
    read_offset: int = 0


def detokenize_step(tokenizer, ids: list[int], state: DetokenizerState, skip_special_tokens: bool) -> str:
    """Returns the text the newest tokens add and advances `state`."""
    prefix = tokenizer.decode(ids[state.prefix_offset : state.read_offset], skip_special_tokens=skip_special_tokens)
    full = tokenizer.decode(ids[state.prefix_offset :], skip_special_tokens=skip_special_tokens)
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        state.prefix_offset = state.read_offset
        state.read_offset = len(ids)
        return full[len(prefix) :]
    return ""
