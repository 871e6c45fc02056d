"""Rotary embedding: inverse frequencies for each rope_type HF checkpoints use, and a cos/sin table.

The formulas follow HF transformers' modeling_rope_utils so positions rotate exactly as in the
reference implementation; tests compare the tables against it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:  # [dim // 2]
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor = p["factor"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are interpolated, short ones kept, the band between blended smoothly
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(
    theta: float, dim: int, p: dict[str, Any], max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    factor = p.get("factor")
    old_len = p["original_max_position_embeddings"]
    if factor is None:
        factor = max_position_embeddings / old_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(old_len / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def rope_inv_freq(
    rope: dict[str, Any], rotary_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Returns (inv_freq [rotary_dim // 2] fp32, attention scaling applied to cos and sin)."""
    rope_type, theta = rope["rope_type"], rope["rope_theta"]
    if rope_type == "default":
        return _base_inv_freq(theta, rotary_dim), 1.0
    if rope_type == "linear":
        return _base_inv_freq(theta, rotary_dim) / rope["factor"], 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(_base_inv_freq(theta, rotary_dim), rope), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(theta, rotary_dim, rope, max_position_embeddings)
    raise ValueError(
        f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin table; the attention layer applies it (fused with QK-norm and the KV write).

    With `mrope` = ((t, h, w) sections, rows) (Qwen3-VL, Qwen3.5) a token's three position ids
    (time, height, width) pick the angle of each frequency: interleaved, frequency j takes the
    h id where j % 3 == 1 and j < 3 * h, the w id where j % 3 == 2 and j < 3 * w, else the t id.
    Text has three equal ids, which is plain RoPE at that id: the table serves it as it is. The
    visual tokens of a step get rows of their own past the table (`write_mrope_rows`), so every
    kernel still reads one row per token."""

    def __init__(
        self, head_dim: int, rope: dict[str, Any], max_positions: int, max_position_embeddings: int,
        mrope: tuple[tuple[int, int, int], int] | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        inv_freq, scaling = rope_inv_freq(rope, rotary_dim, max_position_embeddings)
        inv_freq = inv_freq.to(torch.get_default_device())
        self.max_positions = max_positions
        extra = 0 if mrope is None else mrope[1]
        positions = torch.arange(max_positions + extra, dtype=torch.float32, device=inv_freq.device)
        freqs = positions[:, None] * inv_freq[None, :]  # [max_positions + extra, rotary_dim // 2]
        # [max_positions + extra, rotary_dim], kept in fp32 whatever the model dtype
        cache = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.mrope_rows = extra
        if mrope is not None:
            t, h, w = mrope[0]
            j = torch.arange(rotary_dim // 2)
            axis = torch.zeros_like(j)  # [rotary_dim // 2]: which of (t, h, w) each frequency reads
            axis[(j % 3 == 1) & (j < 3 * h)] = 1
            axis[(j % 3 == 2) & (j < 3 * w)] = 2
            self.register_buffer("mrope_axis", axis.to(inv_freq.device), persistent=False)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self.scaling = scaling

    def write_mrope_rows(self, thw: torch.Tensor) -> None:
        """thw [K, 3] int64 (t, h, w) position ids of a step's visual tokens, on the table's device:
        their cos/sin go to rows max_positions .. max_positions + K - 1, which the step's
        positions name."""
        k = thw.shape[0]
        assert k <= self.mrope_rows, f"{k} visual tokens in a step, room for {self.mrope_rows}"
        ids = thw.gather(1, self.mrope_axis[None, :].expand(k, -1))  # [K, rotary_dim // 2]
        freqs = ids.float() * self.inv_freq[None, :]
        rows = self.cos_sin_cache[self.max_positions : self.max_positions + k]
        rows.copy_(torch.cat((freqs.cos() * self.scaling, freqs.sin() * self.scaling), dim=-1))
