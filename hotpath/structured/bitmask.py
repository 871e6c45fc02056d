"""A step's token mask as it travels from the engine to the runner: which sequences are
constrained and, for each, the tokens it may sample next, one bit a token."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import torch


def bitmask_words(vocab_size: int) -> int:
    """int32 words a mask row takes: bit t % 32 of word t // 32 is token t."""
    return (vocab_size + 31) // 32


@dataclass
class TokenMask:
    seq_ids: list[int]  # the constrained sequences, in mask row order
    bitmask: torch.Tensor  # [len(seq_ids), words] int32 in host memory (pinned where the device is CUDA)


def mask_to_wire(mask: TokenMask) -> dict[str, Any]:
    return {"seq_ids": mask.seq_ids, "shape": list(mask.bitmask.shape),
            "bitmask": base64.b64encode(mask.bitmask.numpy().tobytes()).decode()}


def mask_from_wire(data: dict[str, Any]) -> TokenMask:
    raw = bytearray(base64.b64decode(data["bitmask"]))
    bitmask = torch.frombuffer(raw, dtype=torch.int32) if raw else torch.empty(0, dtype=torch.int32)
    return TokenMask(data["seq_ids"], bitmask.reshape(data["shape"]))
