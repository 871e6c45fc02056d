"""Attention over the paged KV cache for a flat batch of tokens from many sequences."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.ops.attention import paged_attention, write_kv_cache
from hotpath.runner.forward_batch import ForwardBatch


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]; bound by the
        # model runner once it knows how many blocks fit.
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        assert self.kv_cache is not None, "KV cache not bound to the attention layer"
        k_cache, v_cache = self.kv_cache
        write_kv_cache(k, v, k_cache, v_cache, batch.slot_mapping)
        return paged_attention(
            q, k_cache, v_cache, batch.cu_query_lens, batch.context_lens, batch.block_tables,
            self.scale,
        )
