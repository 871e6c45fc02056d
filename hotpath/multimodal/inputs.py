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
    # [t*h*w, C, frames, patch*patch] uint8, in the tower's patch order: frames is the temporal
    # patch for a video; 1 for an image, whose one frame the tower sees repeated to fill it
    pixels: torch.Tensor
    pixel_lut: torch.Tensor  # [C, 256] float32: each channel's normalised value of every uint8
    content_hash: str  # sha256 hex over modality, grid and pixels
    temporal_patch: int  # the tower's frames a patch

    @property
    def pixel_values(self) -> torch.Tensor:
        """[t*h*w, C*temporal_patch*patch*patch] float32: transformers' processor's pixel values."""
        return normalise_pixels([self], self.pixels.device, torch.float32)

    @property
    def num_tokens(self) -> int:
        return sum(length for _, length in self.spans)


def normalise_pixels(items: list[MultiModalItem], device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The tower's input for `items`, [their rows, C * temporal_patch * patch * patch] in `dtype`
    on `device`: the uint8 rows cross to the device as they are (an image's one frame, an eighth
    of its float32 rows' bytes) and are normalised there by each item's lookup table, cast to
    `dtype` first (the same rounding as casting each value), an image's frame repeated."""
    num_rows = sum(item.pixels.shape[0] for item in items)
    _, channels, _, patch_area = items[0].pixels.shape
    out = torch.empty(num_rows, channels, items[0].temporal_patch, patch_area, dtype=dtype, device=device)
    start = 0
    for item in items:
        rows, _, frames, _ = item.pixels.shape
        raw = item.pixels.to(device, non_blocking=True)
        lut = item.pixel_lut.to(device).to(dtype)
        for c in range(channels):
            values = lut[c].index_select(0, raw[:, c].reshape(-1).int()).view(rows, frames, patch_area)
            out[start:start + rows, c] = values  # [rows, frames, P*P], frames 1 broadcast over the patch
        start += rows
    return out.view(num_rows, -1)


@dataclass
class ProcessedPrompt:
    prompt: str | None  # the text it came from, None for a token-id prompt
    prompt_token_ids: list[int]  # placeholders expanded
    mm_items: list[MultiModalItem]  # in prompt order
