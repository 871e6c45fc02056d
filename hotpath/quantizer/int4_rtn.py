"""Group-wise int4 with zero points, round to nearest: the quantization step AWQ and GPTQ share.

A group is G consecutive inputs of one output row; its scale is (max - min) / 15 rounded to fp16
(the checkpoints store fp16 scales, so values are rounded with the stored scale), its zero point
round(-min / scale) in 0..15: w ~ (q - zero) * scale."""

from __future__ import annotations

import torch

MAX_Q = 15


def group_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., G] -> (scale, zero), each [..., 1]; the range always holds 0, as GPTQ's does."""
    wmax = w.amax(-1, keepdim=True).clamp(min=0)
    wmin = w.amin(-1, keepdim=True).clamp(max=0)
    scale = ((wmax - wmin).clamp(min=1e-5) / MAX_Q).to(torch.float16).float()
    zero = (-wmin / scale).round().clamp(0, MAX_Q)
    return scale, zero


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return (torch.round(w / scale) + zero).clamp(0, MAX_Q)


def fake_quantize(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """w [N, K] -> its int4 round trip [N, K] (fp32)."""
    N, K = w.shape
    g = w.float().reshape(N, K // group_size, group_size)
    scale, zero = group_params(g)
    return ((quantize_with(g, scale, zero) - zero) * scale).reshape(N, K)


def quantize_rtn(w: torch.Tensor, group_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] int32, zeros [N, K/G] int32, scales [N, K/G] fp32 holding fp16
    values, the dequantized weight [N, K] fp32)."""
    N, K = w.shape
    g = w.float().reshape(N, K // group_size, group_size)
    scale, zero = group_params(g)
    q = quantize_with(g, scale, zero)
    deq = ((q - zero) * scale).reshape(N, K)
    return q.reshape(N, K).int(), zero[..., 0].int(), scale[..., 0], deq
