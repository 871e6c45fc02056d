"""The Qwen hybrid family: Qwen3-Next and Qwen3.5, Gated DeltaNet (linear attention,
layers/gated_delta.py) interleaved with gated full attention; Qwen3-Next and the Qwen3.5 MoE
models with the shared-expert MoE block of Qwen2-MoE, the dense Qwen3.5 models with a gated MLP.

The released Qwen3.5 checkpoints are the image-text `Qwen3_5ForConditionalGeneration` /
`Qwen3_5MoeForConditionalGeneration` (hotpath/models/qwen_vl.py), around these. Every checkpoint of the family may carry a multi-token-prediction head (`mtp.*`, at the top
level in all of them): the target skips it with one log line, and `hotpath.models.mtp` builds it
on its own when speculative decoding asks for it (method "mtp"). Qwen3.5 rotates positions with
mRoPE, whose three position ids are equal for text: its frequencies then recompose into plain
RoPE, so the text-only checkpoints are served with 1-D RoPE (the HF parity test is the check).

Its layers follow `layer_types` (or every `full_attention_interval`-th layer is full attention, the
rest linear). The full-attention layers emit a sigmoid gate on their output from q_proj, rotate a
quarter of each 256-wide head (`partial_rotary_factor`), and use QK-norm. Every RMSNorm but the
linear attention's gated one is zero-centred (the checkpoint stores w - 1).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch.nn as nn

from hotpath.config import LinearAttentionConfig, ModelConfig
from hotpath.layers.gated_delta import GatedDeltaNet
from hotpath.layers.mlp import GatedMLP
from hotpath.layers.rotary import RotaryEmbedding
from hotpath.models.qwen_moe import Qwen3MoeForCausalLM, moe_config

logger = logging.getLogger("hotpath")


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


def hybrid_config(arch: str, hf: dict[str, Any], moe: bool) -> ModelConfig:
    # Qwen3-Next names its MTP layers num_nextn_predict_layers, Qwen3.5 mtp_num_hidden_layers
    mtp = hf.get("num_nextn_predict_layers", hf.get("mtp_num_hidden_layers"))
    cfg = ModelConfig.common(
        arch, hf, qk_norm=True, attn_output_gate=True, zero_centred_norms=True,
        moe=moe_config(hf, shared_expert=True, norm_topk_prob=True) if moe else None,
        linear_attention=linear_attention_config(hf),
        mtp_num_layers=None if mtp is None else int(mtp),
    )
    if "partial_rotary_factor" in hf:  # published config.json files keep it at the top level
        cfg.rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    return cfg


class Qwen3NextForCausalLM(Qwen3MoeForCausalLM):
    LAYOUT = "qwen3_next"  # the Gated DeltaNet projections' checkpoint layout
    # checkpoint prefixes the model does not load: {prefix: (what, why)}, one log line each
    _SKIPPED: ClassVar[dict[str, tuple[str, str]]] = {
        "mtp.": ("multi-token-prediction head", "built apart, for speculative decoding (models/mtp.py)")}

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        self.skipped_logged: set[str] = set()

    def checkpoint_name(self, name: str) -> str | None:
        for prefix, (what, why) in self._SKIPPED.items():
            if name.startswith(prefix):
                if prefix not in self.skipped_logged:
                    self.skipped_logged.add(prefix)
                    logger.info("skipping the checkpoint's %s weights (%s*): %s", what, prefix, why)
                return None
        return name

    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return hybrid_config(arch, hf, moe=True)

    def make_mixer(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> tuple[str, nn.Module]:
        lin = cfg.linear_attention
        if layer not in lin.layers:
            return super().make_mixer(cfg, rotary, layer)
        return "linear_attn", GatedDeltaNet(cfg.hidden_size, lin.num_k_heads, lin.num_v_heads,
                                            lin.k_head_dim, lin.v_head_dim, lin.conv_width, cfg.rms_norm_eps,
                                            layout=self.LAYOUT)


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    """Its router always renormalises the top-k weights (its config has no norm_topk_prob)."""

    LAYOUT = "qwen3_5"


class Qwen3_5ForCausalLM(Qwen3_5MoeForCausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return hybrid_config(arch, hf, moe=False)

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size)
