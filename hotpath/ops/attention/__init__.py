"""Attention over the paged KV cache."""

from hotpath.ops.attention.reference import paged_attention, write_kv_cache

__all__ = ["paged_attention", "write_kv_cache"]
