"""ForwardBatch: everything a model needs to know about one step's flat token batch.

A step mixes sequences freely: whole prefills, prefill chunks after cached tokens, decodes (one
token) and verify steps (several tokens). Each sequence contributes its next `query_len` tokens;
they are laid out back to back in `input_ids` / `positions` with no padding.

A step that mixes decodes with prefill chunks carries `split`: its few-query sequences (decodes,
verify steps) first, as a batch of their own, then the rest as another, so attention runs the
decode kernel on the first and the prefill kernel on the second. (The prefill kernel's tiles of
128 query rows hold one real row for a decode: at 256 decodes beside a prompt that wasted more
tensor-core work than the whole step's matmuls.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VisualEmbeds:
    """What a step's visual placeholder tokens take from the vision tower (Qwen3-VL, Qwen3.5):
    their embeddings replace the token embeddings, and each DeepStack feature is added to their
    hidden states after the layer of its index (Qwen3-VL; none for Qwen3.5)."""

    rows: torch.Tensor  # [K] int64, the placeholder tokens' rows in the flat batch
    embeds: torch.Tensor  # [K, hidden]
    deepstack: list[torch.Tensor]  # each [K, hidden]


@dataclass
class ForwardBatch:
    cu_query_lens: torch.Tensor  # [num_seqs + 1] int32, query offsets into the flat token batch
    context_lens: torch.Tensor  # [num_seqs] int32, cached tokens + this step's tokens
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot each new token's K/V goes to
    logits_indices: torch.Tensor  # [num_sampled] int64, token rows whose logits are needed
    max_query_len: int
    max_context_len: int
    # (tokens of the decode part, decode part, prefill part): mixed steps only, see above
    split: tuple[int, ForwardBatch, ForwardBatch] | None = None
    # [num_seqs] int64, each sequence's state slot in the linear-attention layers (hybrid models)
    state_slots: torch.Tensor | None = None
    # hybrid prefix caching: (row, tokens into the row's chunk, snapshot id) where the step saves
    # the state of the linear-attention layers, on the host
    state_saves: list[tuple[int, int, int]] | None = None
    cu_query_lens_host: list[int] | None = None  # cu_query_lens as the host built it
    # speculative decoding on hybrid models: the rows that verify drafts (their linear-attention
    # state is rolled back to the tokens kept after acceptance: GatedDeltaNet.rollback), on the
    # host, and their tokens' rows in the flat batch, back to back, on the device
    verify_rows: list[int] | None = None
    verify_tokens: torch.Tensor | None = None
    visual: VisualEmbeds | None = None  # image and video tokens in this step (multimodal models)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]
