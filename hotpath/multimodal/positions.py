"""mRoPE position ids of a sequence whose prompt holds images or videos (Qwen3-VL, Qwen3.5), as
transformers' `get_rope_index` lays them out.

Text tokens take three equal ids that count up by one a token. A run of visual placeholder tokens
(an image, or one temporal step of a video) that starts where the text's id would be p takes, for
its token k of a grid w tokens wide, (t, h, w) = (p, p + k // w, p + k % w); the text after it
continues from p + max(grid height, grid width). So past the last run every id is the token's
index plus a constant, the sequence's `rope_delta` (never positive: a run of h x w tokens moves
the ids on by max(h, w)), which is all its decode steps need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotpath.multimodal.inputs import MultiModalItem


@dataclass(frozen=True)
class _Run:
    offset: int  # its first token's index in the sequence
    end: int
    base: int  # p above
    width: int  # its grid's width in tokens (after the merge)
    shift_after: int  # id - index of the text after it


class MropeLayout:
    """The position ids of one sequence with visual tokens."""

    def __init__(self, items: list[MultiModalItem], merge_size: int) -> None:
        runs = sorted((offset, length, item.grid_thw[1] // merge_size, item.grid_thw[2] // merge_size)
                      for item in items for offset, length in item.spans)
        self.runs: list[_Run] = []
        shift = 0
        for offset, length, height, width in runs:
            assert length == height * width, "a run of visual tokens is one grid step"
            after = shift + max(height, width) - length
            self.runs.append(_Run(offset, offset + length, offset + shift, width, after))
            shift = after
        self.rope_delta = shift

    def positions(self, start: int, end: int) -> tuple[list[int], list[tuple[int, int, int, int]]]:
        """Tokens start .. end - 1: (each one's id, -1 for visual tokens; the visual tokens as
        (index into the range, t, h, w))."""
        ids: list[int] = []
        visual: list[tuple[int, int, int, int]] = []
        pos, shift = start, 0
        for run in self.runs:
            if run.end <= pos:
                shift = run.shift_after
                continue
            if run.offset >= end:
                break
            if pos < run.offset:
                ids.extend(range(pos + shift, run.offset + shift))
                pos = run.offset
            stop = min(end, run.end)
            for i in range(pos - run.offset, stop - run.offset):
                visual.append((len(ids), run.base, run.base + i // run.width, run.base + i % run.width))
                ids.append(-1)
            pos = stop
            shift = run.shift_after
        ids.extend(range(pos + shift, end + shift))
        return ids, visual
