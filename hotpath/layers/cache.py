"""What per-sequence cache a layer needs, declared by the layer and provided by the model runner.

A layer that keeps a cache has `cache_spec()` and `bind_cache(...)`. The runner finds those layers,
sizes the pools from their specs (bytes per token, summed over layers, against the memory budget)
and binds each layer its tensors. Only paged KV exists now; recurrent-state slots for linear
attention come with the hybrid models.
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
