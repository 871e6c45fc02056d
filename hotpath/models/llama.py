"""The dense decoder family: Llama, Qwen2 and Qwen3.

They differ only in q/k/v biases (Qwen2 always, Llama where attention_bias is set) and per-head
RMSNorm on q and k before RoPE (Qwen3); each parses its config.json to say which it has.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from hotpath.config import ModelConfig
from hotpath.layers.mlp import GatedMLP
from hotpath.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return ModelConfig.common(arch, hf)

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size)


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return ModelConfig.common(arch, hf, attention_bias=True)


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        return ModelConfig.common(arch, hf, qk_norm=True)
