"""Attention over the paged KV cache for a flat batch of tokens from many sequences."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.ops.attention import rope_and_paged_attention
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

    def rope_and_attend(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim], before QK-norm and RoPE
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], before QK-norm and RoPE
        v: torch.Tensor,
        positions: torch.Tensor,  # [num_tokens] int64
        cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] fp32
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Optional QK-norm, RoPE, this step's k and v into the cache, then attention (one
        kernel for decode steps on the GPU; see ops/attention.rope_and_paged_attention)."""
        if batch.split is not None:  # a mixed step: decode and prefill parts apart
            n, few, rest = batch.split
            parts = [self.rope_and_attend(q[a:b], k[a:b], v[a:b], positions[a:b], cos_sin_cache,
                                          q_norm_weight, k_norm_weight, eps, part)
                     for a, b, part in ((0, n, few), (n, q.shape[0], rest))]
            return torch.cat(parts)
        k_cache, v_cache = self.caches()
        return rope_and_paged_attention(
            q, k, v, positions, cos_sin_cache, k_cache, v_cache, batch.slot_mapping,
            q_norm_weight, k_norm_weight, eps, batch.cu_query_lens, batch.context_lens,
            batch.block_tables, self.scale, batch.max_query_len, batch.max_context_len,
        )

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.kv_cache is not None, "KV cache not bound to the attention layer"
        return self.kv_cache
