"""The Qwen mixture-of-experts family: Qwen3-MoE and Qwen2-MoE.

Both are the dense Qwen decoder with a sparse MoE block (layers/moe.py) as the MLP of every
`decoder_sparse_step`-th layer not listed in `mlp_only_layers` (those keep a dense MLP of
`intermediate_size`). Qwen3-MoE has Qwen3's QK-norm and no shared expert; Qwen2-MoE has Qwen2's q/k/v
biases and a shared expert behind a sigmoid gate, the block Qwen3-Next and Qwen3.5 reuse.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from hotpath.config import ModelConfig, MoeConfig
from hotpath.layers.mlp import GatedMLP
from hotpath.layers.moe import SparseMoeBlock
from hotpath.models.decoder import CausalLM


def moe_config(hf: dict[str, Any], shared_expert: bool, norm_topk_prob: bool = False) -> MoeConfig:
    """`norm_topk_prob`: its value where config.json does not say (HF's default for the family)."""
    num_layers = hf["num_hidden_layers"]
    # transformers 5 writes num_local_experts where published checkpoints say num_experts
    num_experts = hf.get("num_experts", hf.get("num_local_experts"))
    if num_experts is None:
        raise ValueError("config.json of an MoE model names no num_experts")
    top_k = hf["num_experts_per_tok"]
    if num_experts and not 0 < top_k <= num_experts:
        raise ValueError(f"num_experts_per_tok must be in 1..num_experts ({num_experts}), got {top_k}")
    step = hf.get("decoder_sparse_step", 1)
    dense_layers = set(hf.get("mlp_only_layers") or [])
    sparse = frozenset(i for i in range(num_layers)
                       if num_experts > 0 and i not in dense_layers and (i + 1) % step == 0)
    return MoeConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=hf["moe_intermediate_size"],
        norm_topk_prob=bool(hf.get("norm_topk_prob", norm_topk_prob)),
        sparse_layers=sparse,
        shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0) if shared_expert else 0,
    )


class Qwen3MoeForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return ModelConfig.common(arch, hf, qk_norm=True, moe=moe_config(hf, shared_expert=False))

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        moe = cfg.moe
        if layer not in moe.sparse_layers:
            return GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        return SparseMoeBlock(cfg.hidden_size, moe.num_experts, moe.top_k, moe.intermediate_size,
                              moe.norm_topk_prob, moe.shared_expert_intermediate_size)


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        # Qwen2-MoE's q/k/v always have biases (its config.json has no attention_bias key)
        return ModelConfig.common(arch, hf, attention_bias=True, moe=moe_config(hf, shared_expert=True))
