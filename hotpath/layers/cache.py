"""What per-sequence cache a layer needs, declared by the layer and provided by the model runner.

A layer that keeps a cache has `cache_spec()` and `bind_cache(...)`. The runner finds those layers,
sizes the pools from their specs against the memory budget and binds each layer its tensors:
paged K/V blocks for attention layers (`KVCacheSpec`, bytes per token), and a state slot per
running sequence for linear-attention layers (`StateCacheSpec`, bytes per slot; the engine gives
each sequence a slot, `Sequence.state_slot`). Hybrid models have both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheSpec:
    """Paged K and V for one attention layer: [num_blocks, block_size, num_kv_heads, head_dim] each."""

    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_kv_heads * self.head_dim * dtype.itemsize

    def allocate(self, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        return (torch.empty(shape, dtype=dtype, device=device),
                torch.empty(shape, dtype=dtype, device=device))


@dataclass(frozen=True)
class StateCacheSpec:
    """Fixed-size per-sequence state of a linear-attention layer, one slot per running sequence:
    the causal conv's last inputs [conv_dim, conv_width - 1] (model dtype) and the recurrent
    state [num_v_heads, k_head_dim, v_head_dim] (fp32)."""

    conv_dim: int
    conv_width: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        conv = self.conv_dim * (self.conv_width - 1) * dtype.itemsize
        return conv + self.num_v_heads * self.k_head_dim * self.v_head_dim * 4

    def allocate(self, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        conv = torch.zeros((num_slots, self.conv_dim, self.conv_width - 1), dtype=dtype, device=device)
        state = torch.zeros((num_slots, self.num_v_heads, self.k_head_dim, self.v_head_dim),
                            dtype=torch.float32, device=device)
        return conv, state
