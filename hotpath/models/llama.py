"""The dense decoder shared by Llama, Qwen2 and Qwen3.

The three differ only in q/k/v biases (Qwen2, or Llama with attention_bias) and per-head RMSNorm on
q and k before RoPE (Qwen3); both are config flags, so one class serves all three.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.layers.activation import GatedMLP
from hotpath.layers.attention import Attention
from hotpath.layers.embedding import LMHead, VocabEmbedding
from hotpath.layers.linear import Linear
from hotpath.layers.norm import RMSNorm
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.ops.embedding import embedding_with_sumsq
from hotpath.ops.linear import linear, linear_add_residual, linear_silu_and_mul, use_gemv
from hotpath.runner.forward_batch import ForwardBatch


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(
            cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], bias=cfg.attention_bias
        )
        self.o_proj = Linear(self.q_size, [cfg.hidden_size])
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        return self.o_proj(self.attend(positions, self.qkv_proj(x), batch))

    def attend(
        self, positions: torch.Tensor, qkv: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [num_tokens, q_size]
        """Attention from the q/k/v projections, this step's k/v written to the cache."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        else:
            qk_norm = (None, None, 0.0)
        # QK-norm (Qwen3), RoPE and this step's k/v into the cache, fused with the attention
        # itself for decode steps on the GPU
        out = self.attn.rope_and_attend(q, k, v, positions, self.rotary.cos_sin_cache, *qk_norm, batch)
        return out.reshape(-1, self.q_size)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual

    def forward_few_rows(
        self,
        positions: torch.Tensor,
        h: torch.Tensor,  # [M, hidden], the residual stream, updated in place
        sumsq: torch.Tensor,  # [T, M] fp32 h's partial sums of squares
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [T, M] fp32, the new h's
        """`forward` for a step of a few tokens (decode), where every projection is a GEMV: each
        RMSNorm is applied as the next projection loads its input (from the statistic the
        previous one's epilogue, or the embedding lookup, gathered), and SiLU-and-mul is fused
        into gate_up: four GEMV launches and two of attention (QK-norm and RoPE included; the
        merge of its splits) per layer, rather than ten launches."""
        attn, mlp = self.self_attn, self.mlp
        norm, post_norm = self.input_layernorm, self.post_attention_layernorm
        qkv = linear(h, attn.qkv_proj.weight, attn.qkv_proj.bias, rms=(sumsq, norm.weight, norm.eps))
        out = attn.attend(positions, qkv, batch)
        sumsq = linear_add_residual(out, attn.o_proj.weight, h)
        y = linear_silu_and_mul(h, mlp.gate_up_proj.weight, rms=(sumsq, post_norm.weight, post_norm.eps))
        return linear_add_residual(y, mlp.down_proj.weight, h)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.rope, max_positions, cfg.max_position_embeddings)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [num_tokens, hidden], after the final RMSNorm
        if self.few_rows(input_ids.shape[0]):
            # the final norm a launch of its own: folded into the LM head's loads, every one of
            # its ~19k programs read the statistic and the norm weight, and Qwen3-32B's step was
            # ~3% slower (run M)
            return self.norm(self.forward_few_rows(input_ids, positions, batch))
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, batch)
        x, _ = self.norm(x, residual)
        return x

    def few_rows(self, num_tokens: int) -> bool:
        """Whether a forward of `num_tokens` tokens runs every projection of its layers as a
        Triton GEMV, so the fused layer (DecoderLayer.forward_few_rows)."""
        w = self.embed_tokens.weight
        x = w[:1].expand(num_tokens, -1)  # stands for the step's input: its rows, dtype, device
        first = self.layers[0]
        projections = (first.self_attn.qkv_proj, first.self_attn.o_proj, first.mlp.gate_up_proj,
                       first.mlp.down_proj)
        return all(use_gemv(x, p.weight) for p in projections)

    def forward_few_rows(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:  # [M, hidden]
        """The layers of a step of a few tokens (DecoderLayer.forward_few_rows): the residual
        stream after the last layer, before the final RMSNorm. The embedding lookup stores the
        first layer's RMSNorm statistic, so no norm launch runs before its qkv projection."""
        h, sumsq = embedding_with_sumsq(input_ids, self.embed_tokens.weight)
        for layer in self.layers:
            sumsq = layer.forward_few_rows(positions, h, sumsq, batch)
        return h


# merged module -> the checkpoint projections stacked in it, in order
_MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_STACKED = {ckpt: (merged, i) for merged, ckpts in _MERGED.items() for i, ckpt in enumerate(ckpts)}


class DecoderForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, max_positions)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        return self.model(input_ids, positions, batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [rows, vocab] fp32
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into the parameters, one at a time."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            module_name, _, param_name = name.rpartition(".")
            prefix, _, leaf = module_name.rpartition(".")
            if leaf in _STACKED:
                merged, shard = _STACKED[leaf]
                try:
                    self.get_submodule(f"{prefix}.{merged}").load_shard(param_name, tensor, shard)
                except (AttributeError, ValueError) as e:
                    raise ValueError(f"checkpoint tensor {name!r}: {e}") from None
            elif name in params:
                param = params[name]
                if param.shape != tensor.shape:
                    raise ValueError(
                        f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(param.shape)}"
                    )
                param.data.copy_(tensor)
            else:
                raise ValueError(f"checkpoint tensor {name!r} does not belong to this model")
            loaded.add(name)
        missing = [n for n in self.expected_weight_names() if n not in loaded]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weights: {shown}")

    def expected_weight_names(self) -> list[str]:
        """The checkpoint (HF) tensor names this model needs."""
        names = []
        for name, _ in self.named_parameters():  # a tied lm_head is listed once, as the embedding
            module_name, _, param_name = name.rpartition(".")
            prefix, _, leaf = module_name.rpartition(".")
            if leaf in _MERGED:
                names += [f"{prefix}.{ckpt}.{param_name}" for ckpt in _MERGED[leaf]]
            else:
                names.append(name)
        return names
