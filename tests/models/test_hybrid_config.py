"""The hybrid family's config parsing: layer types from full_attention_interval where layer_types
is absent, a clear error for a bad list, and the image-text checkpoint's text_config."""

import pytest

from hotpath.models.registry import config_from_hf

HYBRID = dict(architectures=["Qwen3NextForCausalLM"], vocab_size=100, hidden_size=64, intermediate_size=96,
              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=48, partial_rotary_factor=0.25)


def test_full_attention_interval():
    cfg = config_from_hf(dict(HYBRID, full_attention_interval=4))
    assert cfg.linear_attention.layers == {0, 1, 2, 4, 5, 6}
    assert cfg.rope["partial_rotary_factor"] == 0.25
    assert cfg.zero_centred_norms and cfg.attn_output_gate and cfg.qk_norm
    assert cfg.moe.shared_expert_intermediate_size == 48 and cfg.moe.norm_topk_prob


def test_bad_layer_types():
    with pytest.raises(ValueError, match="layer_types must name full_attention or linear_attention"):
        config_from_hf(dict(HYBRID, layer_types=["linear_attention"] * 7 + ["mamba"]))
    with pytest.raises(ValueError, match="for each of the 8 layers"):
        config_from_hf(dict(HYBRID, layer_types=["full_attention"] * 3))


def test_image_text_checkpoint_reads_its_text_config():
    text = {k: v for k, v in HYBRID.items() if k != "architectures"}
    cfg = config_from_hf(dict(architectures=["Qwen3_5MoeForConditionalGeneration"], text_config=text,
                              tie_word_embeddings=True))
    assert cfg.architecture == "Qwen3_5MoeForConditionalGeneration" and cfg.tie_word_embeddings
    assert cfg.moe.norm_topk_prob  # Qwen3.5's router always renormalises
    with pytest.raises(ValueError, match="has no text_config"):
        config_from_hf(dict(architectures=["Qwen3_5ForConditionalGeneration"], vision_config={}))
