"""Attention over the paged KV cache, and the self-attention block of a decoder layer around it."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn

from hotpath.layers.cache import KVCacheSpec
from hotpath.layers.linear import Linear, QKVLinear, WeightLoaders
from hotpath.layers.norm import RMSNorm
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.ops.attention import rope_and_paged_attention
from hotpath.ops.attention.reference import FP8_KV_DTYPES
from hotpath.layers.forward_batch import ForwardBatch


class Attention(nn.Module):
    """Attention for a flat batch of tokens from many sequences; declares its paged KV cache.

    The cache is in the model dtype, or in fp8 (`--kv-cache-dtype fp8`, as the runner allocates
    it): then it holds k / k_scale and v / v_scale in e4m3, with this layer's scales from the
    checkpoint when it has them (vLLM's names), 1.0 otherwise."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]; bound by the
        # model runner once it knows how many blocks fit.
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        # the checkpoint's fp8 KV scales (k = k_fp8 * k_scale, in e4m3fn's terms)
        self.k_scale = 1.0
        self.v_scale = 1.0

    def optional_checkpoint_tensors(self, prefix: str) -> WeightLoaders:
        """The checkpoint tensors this layer takes when they are there: the fp8 KV cache's
        scales, named on the attention block (`model.layers.N.self_attn.k_scale`, as vLLM and
        ModelOpt / Quark checkpoints have them) or on its projections
        (`...self_attn.k_proj.output_scale`, compressed-tensors' kv_cache_scheme)."""
        block = prefix.rpartition(".")[0]  # the block holding this layer, e.g. ...self_attn
        loaders: WeightLoaders = {}
        for which in ("k", "v"):
            loaders[f"{block}.{which}_scale"] = partial(self._load_scale, which)
            loaders[f"{block}.{which}_proj.output_scale"] = partial(self._load_scale, which)
        return loaders

    def _load_scale(self, which: str, tensor: torch.Tensor) -> None:
        if tensor.numel() != 1:
            raise ValueError(f"has shape {tuple(tensor.shape)}: the KV cache takes one scale per "
                             "layer for K and one for V")
        value = float(tensor.float())
        if not 0 < value < math.inf:
            raise ValueError(f"is {value}: a KV cache scale must be positive and finite")
        setattr(self, f"{which}_scale", value)

    def cache_scales(self) -> tuple[float, float]:
        """(k_scale, v_scale) that the bound cache is written and read with (ignored unless it is
        fp8). An e4m3fnuz cache (AMD gfx942) takes them doubled: its bits mean half what they
        mean in e4m3fn, so it then holds the same values an e4m3fn cache would."""
        if self.caches()[0].dtype == torch.float8_e4m3fnuz:
            return 2 * self.k_scale, 2 * self.v_scale
        return self.k_scale, self.v_scale

    def cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.num_kv_heads, self.head_dim)

    def bind_cache(self, cache: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.kv_cache = cache

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
        positions_apart: bool = False,  # mRoPE: positions are not the cache positions
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Optional QK-norm, RoPE, this step's k and v into the cache, then attention (one
        kernel for decode steps on the GPU; see ops/attention.rope_and_paged_attention)."""
        if batch.split is not None:  # a mixed step: decode and prefill parts apart
            n, few, rest = batch.split
            parts = [self.rope_and_attend(q[a:b], k[a:b], v[a:b], positions[a:b], cos_sin_cache,
                                          q_norm_weight, k_norm_weight, eps, part, positions_apart)
                     for a, b, part in ((0, n, few), (n, q.shape[0], rest))]
            return torch.cat(parts)
        k_cache, v_cache = self.caches()
        # the scales only for an fp8 cache (others ignore them; benchmarks/decode_variants.py
        # swaps in variants of the op that take the 16-bit call)
        scales = {}
        if k_cache.dtype in FP8_KV_DTYPES:
            scales = dict(zip(("k_scale", "v_scale"), self.cache_scales()))
        return rope_and_paged_attention(
            q, k, v, positions, cos_sin_cache, k_cache, v_cache, batch.slot_mapping,
            q_norm_weight, k_norm_weight, eps, batch.cu_query_lens, batch.context_lens,
            batch.block_tables, self.scale, batch.max_query_len, batch.max_context_len, **scales,
            positions_apart=positions_apart,
        )

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.kv_cache is not None, "KV cache not bound to the attention layer"
        return self.kv_cache


class SelfAttention(nn.Module):
    """qkv projection, optional per-head QK-norm (Qwen3), RoPE, paged attention, o projection.

    `output_gate` (Qwen3-Next, Qwen3.5): q_proj emits, per head, the query and then a gate of the
    same size, and the attention output is multiplied by sigmoid(gate) before o_proj.

    Under tensor parallelism the heads split over the ranks (qkv_proj column-parallel by heads,
    KV heads replicated where there are fewer than ranks; o_proj row-parallel): this rank attends
    with its `num_heads` / `num_kv_heads`, its cache holds only its KV heads, and `forward`
    returns its partial sum of the output, which the decoder layer reduces."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        qkv_bias: bool,
        qk_norm_eps: float | None,  # None: no QK-norm
        output_gate: bool = False,
        zero_centred_norms: bool = False,
    ) -> None:
        super().__init__()
        self.output_gate = output_gate
        self.qkv_proj = QKVLinear(hidden_size, head_dim, num_heads, num_kv_heads, bias=qkv_bias,
                                  q_head_width=2 * head_dim if output_gate else head_dim)
        # this rank's heads (all of them on one rank)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        self.o_proj = Linear(num_heads * head_dim, [hidden_size], parallel="row")
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, zero_centred_norms)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, zero_centred_norms)
        self.rotary = rotary
        self.attn = Attention(self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        return self.o_proj(self.attend(positions, self.qkv_proj(x), batch))

    def fuses(self, x: torch.Tensor) -> bool:
        return self.qkv_proj.fuses(x) and self.o_proj.fuses(x)

    def forward_few_rows(
        self,
        positions: torch.Tensor,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32, h's partial sums of squares
        norm: RMSNorm,  # the input RMSNorm, applied as qkv_proj loads h
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [T', M] fp32, the new h's
        """h += o_proj(attention(qkv_proj(norm(h)))): two projection launches and attention's."""
        qkv = self.qkv_proj(h, rms=(sumsq, norm.weight, norm.eps))
        return self.o_proj.add_residual(self.attend(positions, qkv, batch), h)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Attention from the q/k/v projections, this step's k/v written to the cache."""
        q_out = 2 * self.q_size if self.output_gate else self.q_size
        q, k, v = qkv.split([q_out, self.kv_size, self.kv_size], dim=-1)
        gate = None
        if self.output_gate:  # [num_tokens, num_heads, 2 * head_dim]: each head's query, then gate
            q, gate = q.reshape(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            q = q.contiguous()
            gate = gate.reshape(-1, self.q_size)
        q = q.reshape(-1, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        else:
            qk_norm = (None, None, 0.0)
        # QK-norm, RoPE and this step's k/v into the cache, fused with the attention itself for
        # decode steps on the GPU
        out = self.attn.rope_and_attend(q, k, v, positions, self.rotary.cos_sin_cache, *qk_norm, batch,
                                        positions_apart=self.rotary.mrope_rows > 0)
        out = out.reshape(-1, self.q_size)
        return out if gate is None else out * torch.sigmoid(gate)
