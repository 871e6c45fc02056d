"""The step as a message: what the engine sends a worker for one step, and what comes back.

The engine decides (scheduler, sequences, speculation policy) and describes a step as a `StepPlan`:
the sequences the workers do not hold yet (`NewSeq`: new requests, or preempted ones coming back),
and one `RowPlan` per scheduled sequence (how many tokens it feeds, where its cache is, this step's
drafts). A worker keeps a `SeqState` per sequence (runner/seq_state.py) and appends the tokens it
samples itself, so no plan carries a sequence's tokens twice. Plans are plain data: the in-process
executor hands them over as they are; the multi-process one sends `to_wire` dicts (JSON, no
pickle: executor/channel.py).
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from hotpath.multimodal.inputs import MultiModalItem
from hotpath.sampling_params import SamplingParams

# the most sequences that verify drafts in one step (the engine gives the rest none that step):
# the speculative graphs' rows (a verify graph's logits buffer takes rows x (1 + K) x vocab fp32),
# and the verify rows whose states a hybrid model keeps for the rollback (budgeted for this many)
SPEC_GRAPH_MAX_ROWS = 64


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]  # [(token_id, logprob)] best first; empty unless asked


@dataclass(slots=True)
class NewSeq:
    """A sequence the workers do not hold: its tokens so far and how it samples."""

    seq_id: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop_token_ids: list[int]
    seed: int | None  # its sampling generator's seed (None: the global generator)
    num_pending_tokens: int = 0  # sampled by a step in flight, not on the host yet
    mm_items: list[MultiModalItem] = field(default_factory=list)  # its images and videos


@dataclass(slots=True)
class RowPlan:
    """One scheduled sequence: `num_new` tokens from position `num_computed_tokens` (its own
    tokens, then `drafts`), over a block table of which the workers hold the first `blocks_from`
    entries (`blocks` are the rest)."""

    seq_id: int
    num_new: int
    num_computed_tokens: int
    blocks_from: int
    blocks: list[int]
    state_slot: int | None = None
    restore_snapshot: int | None = None  # hybrid prefix hit: the snapshot its slot starts from
    save_at: tuple[int, int] | None = None  # hybrid: (tokens into the chunk, snapshot id) to save
    drafts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class StepPlan:
    new: list[NewSeq]
    rows: list[RowPlan]
    forget: list[int] = field(default_factory=list)  # finished sequences: drop their state
    # rows whose input token is still pending take it from the step launched just before
    uses_prev: bool = False
    # structured output: the step samples once its token mask arrives (executor.sample)
    mask_follows: bool = False


def to_wire(plan: StepPlan) -> dict[str, Any]:
    # the images (pixel tensors) apart: asdict would deep-copy them
    data = asdict(replace(plan, new=[replace(new, mm_items=[]) for new in plan.new]))
    for s, new in zip(data["new"], plan.new):
        s["mm_items"] = [_item_to_wire(item) for item in new.mm_items]
    return data


def from_wire(data: dict[str, Any]) -> StepPlan:
    new = [NewSeq(**{**s, "params": SamplingParams(**s["params"]),
                     "mm_items": [_item_from_wire(m) for m in s["mm_items"]]}) for s in data["new"]]
    rows = [RowPlan(**{**r, "save_at": tuple(r["save_at"]) if r["save_at"] is not None else None})
            for r in data["rows"]]
    return StepPlan(new, rows, data["forget"], data["uses_prev"], data["mask_follows"])


def _item_to_wire(item: MultiModalItem) -> dict[str, Any]:
    pixels, lut = item.pixels.contiguous(), item.pixel_lut.float().contiguous()
    return {"modality": item.modality, "spans": item.spans, "grid_thw": item.grid_thw,
            "pixels": base64.b64encode(pixels.numpy().tobytes()).decode(), "shape": list(pixels.shape),
            "lut": base64.b64encode(lut.numpy().tobytes()).decode(), "lut_shape": list(lut.shape),
            "content_hash": item.content_hash, "temporal_patch": item.temporal_patch}


def _item_from_wire(data: dict[str, Any]) -> MultiModalItem:
    pixels = torch.frombuffer(bytearray(base64.b64decode(data["pixels"])), dtype=torch.uint8).reshape(data["shape"])
    lut = torch.frombuffer(bytearray(base64.b64decode(data["lut"])), dtype=torch.float32).reshape(data["lut_shape"])
    return MultiModalItem(data["modality"], [tuple(s) for s in data["spans"]], tuple(data["grid_thw"]),
                          pixels, lut, data["content_hash"], data["temporal_patch"])


def tokens_to_wire(tokens: dict[int, list[SampledToken]]) -> list:
    return [[seq_id, [[t.token_id, t.logprob, t.top_logprobs] for t in ts]] for seq_id, ts in tokens.items()]


def tokens_from_wire(data: list) -> dict[int, list[SampledToken]]:
    return {seq_id: [SampledToken(t, lp, [tuple(x) for x in top]) for t, lp, top in ts]
            for seq_id, ts in data}


def decode_graph_size(rows: list[tuple[Any, int]], sizes: list[int]) -> int:
    """The captured decode batch size (of ascending `sizes`) a step of (sequence, tokens) rows
    replays, or 0 where it runs eagerly: every row decodes one token."""
    if not sizes:
        return 0
    for seq, n in rows:
        if n != 1 or seq.num_computed_tokens + 1 != seq.num_tokens:  # a decode: its newest token only
            return 0
    return next((size for size in sizes if size >= len(rows)), 0)
