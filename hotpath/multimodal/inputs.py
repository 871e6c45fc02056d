"""What the processor hands the engine: a prompt's token ids and its preprocessed media."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MultiModalItem:
    """One image or video, ready for the vision tower."""

    modality: str  # "image" or "video"
    # (offset into prompt_token_ids, length) of each contiguous run of this item's placeholder
    # tokens: one for an image; one per temporal grid step for a video, whose frames are
    # separated by timestamp text
    spans: list[tuple[int, int]]
    grid_thw: tuple[int, int, int]  # the tower's patch grid before the merge (transformers' *_grid_thw row)
    pixel_values: torch.Tensor  # [t*h*w, C*temporal_patch*patch*patch] float32, in the tower's patch order
    content_hash: str  # sha256 hex over modality, grid and pixel values

    @property
    def num_tokens(self) -> int:
        return sum(length for _, length in self.spans)


@dataclass
class ProcessedPrompt:
    prompt: str | None  # the text it came from, None for a token-id prompt
    prompt_token_ids: list[int]  # placeholders expanded
    mm_items: list[MultiModalItem]  # in prompt order
