"""Random inputs for the op tests: paged KV caches with ragged batches, and error measures."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in fp64; NaN anywhere in out fails loudly."""
    assert not torch.isnan(out).any(), "output holds NaN (a part the kernel did not write?)"
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def cos_sin(max_positions: int, rotary_dim: int, device) -> torch.Tensor:
    """A RoPE table as the model keeps it: [max_positions, rotary_dim] fp32, cos then sin."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


# relative error the kernels must stay under, by input dtype (against an fp32 reference)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2.5e-3}


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim] (maybe a strided view)
    v_cache: torch.Tensor
    cu_query_lens: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int
    max_context_len: int

    def args(self, scale: float) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.cu_query_lens, self.context_lens,
                self.block_tables, scale, self.max_query_len, self.max_context_len)

    def fp32_args(self, scale: float) -> tuple:
        """The same inputs in fp32, for a reference that rounds nothing."""
        return (self.q.float(), self.k_cache.float(), self.v_cache.float(), self.cu_query_lens,
                self.context_lens, self.block_tables, scale, self.max_query_len,
                self.max_context_len)


def empty_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, device, layout: str
) -> torch.Tensor:
    """A NaN-filled cache indexed [block, row, kv_head, dim]; `layout` picks the memory order:
    "nhd" stores it as indexed, "hnd" as [block, kv_head, row, dim]."""
    if layout == "nhd":
        return torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                          dtype=dtype, device=device)
    assert layout == "hnd"
    store = torch.full((num_blocks, num_kv_heads, block_size, head_dim), float("nan"),
                       dtype=dtype, device=device)
    return store.transpose(1, 2)


def paged_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    layout: str = "nhd",
    seed: int = 0,
) -> PagedBatch:
    """Sequences own blocks scattered at random over the pool; cache slots past each context are
    NaN, as are block 0 (where padded block-table entries point) and spare blocks, so a kernel
    that reads what it should not fails."""
    assert all(0 < q <= c for q, c in zip(query_lens, context_lens))
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, layout)
    v_cache = empty_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device, layout)
    order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    block_tables = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    for i, ctx in enumerate(context_lens):
        pos = torch.arange(ctx)
        blocks = block_tables[i, pos // block_size].long().to(device)
        rows = (pos % block_size).to(device)
        k_cache[blocks, rows] = torch.randn(ctx, num_kv_heads, head_dim, generator=g).to(device, dtype)
        v_cache[blocks, rows] = torch.randn(ctx, num_kv_heads, head_dim, generator=g).to(device, dtype)
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], num_heads, head_dim, generator=g).to(device, dtype)
    return PagedBatch(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu_query_lens=torch.tensor(cu, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
    )


def activations(M, K, dtype=torch.float32, device="cpu", seed=1):
    """Random [M, K] inputs of a linear layer (the quantized ops' tests)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g) * 2).to(device, dtype)


def norm_inputs(M, K, dtype, device, seed=3):
    """An un-normalised input and its RMSNorm statistic in three partial sums, the norm weight."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(M, K, generator=g) * 3).to(device, dtype)
    sumsq = torch.stack([c.float().pow(2).sum(-1) for c in h.tensor_split(3, dim=-1)])
    norm_w = (torch.rand(K, generator=g) + 0.5).to(device, dtype)
    return h, (sumsq, norm_w, 1e-6)
