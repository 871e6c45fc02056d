"""Every supported architecture loads from a checkpoint that transformers' own config class wrote:
no family's parsing may require a field that class does not define (Qwen3_5MoeTextConfig has no
intermediate_size, and published Qwen3.5 / Qwen3.6 MoE configs differ on whether they carry one)."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from hotpath.loader.model_loader import load_model
from hotpath.models.registry import MODEL_REGISTRY, read_config

# architecture -> transformers' config class; its defaults except the sizes below (a tiny model)
CONFIG_CLASSES = {
    "LlamaForCausalLM": "LlamaConfig", "Qwen2ForCausalLM": "Qwen2Config", "Qwen3ForCausalLM": "Qwen3Config",
    "Qwen2MoeForCausalLM": "Qwen2MoeConfig", "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
    "Qwen3NextForCausalLM": "Qwen3NextConfig", "Qwen3_5ForCausalLM": "Qwen3_5TextConfig",
    "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig", "Qwen3_5ForConditionalGeneration": "Qwen3_5Config",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeConfig",
    "Qwen3VLForConditionalGeneration": "Qwen3VLConfig", "Qwen3VLMoeForConditionalGeneration": "Qwen3VLMoeConfig",
}
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, max_position_embeddings=512)


def tiny(cls) -> dict:
    """TINY's sizes that cls takes (a field it does not define stays out, as in its own configs)."""
    own = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in TINY.items() if k in own}


def test_every_architecture_has_its_config_class():
    assert set(CONFIG_CLASSES) == set(MODEL_REGISTRY)


@pytest.mark.parametrize("arch", sorted(CONFIG_CLASSES))
def test_loads_from_transformers_config_class(arch, tmp_path):
    cls = getattr(transformers, CONFIG_CLASSES[arch])
    if "text_config" in inspect.signature(cls.__init__).parameters:  # an image-text checkpoint
        text_cls, vision_cls = cls.sub_configs["text_config"], cls.sub_configs["vision_config"]
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64)
        if "deepstack_visual_indexes" in inspect.signature(vision_cls.__init__).parameters:
            vision["deepstack_visual_indexes"] = [0]  # the default's [8, 16, 24] need 25 layers
        config = cls(text_config=tiny(text_cls), vision_config=vision)
    else:
        config = cls(**tiny(cls))
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    cfg = read_config(tmp_path)
    assert cfg.architecture == arch and cfg.hidden_size == 64
    model = load_model(cfg, tmp_path, "dummy", torch.device("cpu"), torch.float32, 64)
    assert sum(p.numel() for p in model.parameters()) > 0
