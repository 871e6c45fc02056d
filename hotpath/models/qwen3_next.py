"""Qwen3-Next: a hybrid of Gated DeltaNet (linear attention, layers/gated_delta.py) and gated full
attention, with the shared-expert MoE block of Qwen2-MoE.

Its layers follow `layer_types` (or every `full_attention_interval`-th layer is full attention, the
rest linear). The full-attention layers emit a sigmoid gate on their output from q_proj, rotate a
quarter of each 256-wide head (`partial_rotary_factor`), and use QK-norm. Every RMSNorm but the
linear attention's gated one is zero-centred (the checkpoint stores w - 1).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from hotpath.config import LinearAttentionConfig, ModelConfig
from hotpath.layers.gated_delta import GatedDeltaNet
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.models.decoder import CausalLM
from hotpath.models.qwen_moe import Qwen3MoeForCausalLM, moe_config


def linear_attention_config(hf: dict[str, Any]) -> LinearAttentionConfig:
    num_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        interval = hf.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= {"full_attention", "linear_attention"}:
        raise ValueError(f"layer_types must name full_attention or linear_attention for each of the "
                         f"{num_layers} layers, got {types}")
    return LinearAttentionConfig(
        layers=frozenset(i for i, t in enumerate(types) if t == "linear_attention"),
        num_k_heads=hf["linear_num_key_heads"],
        num_v_heads=hf["linear_num_value_heads"],
        k_head_dim=hf["linear_key_head_dim"],
        v_head_dim=hf["linear_value_head_dim"],
        conv_width=hf.get("linear_conv_kernel_dim", 4),
    )


class Qwen3NextForCausalLM(Qwen3MoeForCausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        cfg = ModelConfig.common(
            arch, hf, qk_norm=True, attn_output_gate=True, zero_centred_norms=True,
            moe=moe_config(hf, shared_expert=True), linear_attention=linear_attention_config(hf),
        )
        if "partial_rotary_factor" in hf:  # published config.json files keep it at the top level
            cfg.rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
        return cfg

    def make_mixer(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> tuple[str, nn.Module]:
        lin = cfg.linear_attention
        if layer not in lin.layers:
            return super().make_mixer(cfg, rotary, layer)
        return "linear_attn", GatedDeltaNet(cfg.hidden_size, lin.num_k_heads, lin.num_v_heads,
                                            lin.k_head_dim, lin.v_head_dim, lin.conv_width, cfg.rms_norm_eps)
