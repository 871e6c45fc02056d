"""The token bitmask applied to logits in torch: the readable definition the Triton kernel is
tested against."""

from __future__ import annotations

import torch


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Sets to -inf, in place, every token a mask row refuses.

    `logits` [num_rows, vocab] (any float dtype); `bitmask` [num_masked, words] int32, bit t % 32
    of word t // 32 set where token t is allowed (tokens past 32 * words are refused);
    `rows` [num_masked] int64: the logits row each mask row applies to (each row at most once).
    Rows not named keep their logits."""
    if rows.numel() == 0:
        return
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask[:, :, None] >> shifts) & 1  # [num_masked, words, 32]
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()  # [num_masked, <= vocab]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
