"""Published model shapes as config.json presets, for benchmarks with random weights."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hotpath.quantizer import formats

_QWEN3 = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, head_dim=128,
    rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, torch_dtype="bfloat16",
    hidden_act="silu", eos_token_id=151645, bos_token_id=151643,
)

_QWEN3_MOE = dict(
    _QWEN3, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=128,
    num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    num_key_value_heads=4, tie_word_embeddings=False,
)

# the hybrids: Gated DeltaNet (16 key heads, 32 value heads of 128) in three of every four layers,
# gated attention (16 heads of 256 over 2 KV heads, a quarter rotated) in the fourth
_HYBRID = dict(
    head_dim=256, num_attention_heads=16, num_key_value_heads=2, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, full_attention_interval=4, partial_rotary_factor=0.25,
    rope_theta=10000000.0, rms_norm_eps=1e-6, max_position_embeddings=262144, torch_dtype="bfloat16",
    hidden_act="silu", tie_word_embeddings=False, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[],
)

PRESETS: dict[str, dict] = {
    "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-32b": dict(_QWEN3, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(_QWEN3_MOE, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32),
    "qwen3-235b-a22b": dict(_QWEN3_MOE, hidden_size=4096, intermediate_size=12288,
                            moe_intermediate_size=1536, num_hidden_layers=94, num_attention_heads=64),
    "qwen3-next-80b-a3b": dict(
        _HYBRID, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=151936,
        hidden_size=2048, intermediate_size=5120, num_hidden_layers=48, num_experts=512,
        num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        eos_token_id=151645, bos_token_id=151643),
    # the text model of Qwen3.5-9B: 4 KV heads, a dense MLP
    "qwen3.5-9b": dict(
        _HYBRID, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320,
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_key_value_heads=4),
    # the text models of Qwen3.5-0.8B (16 value heads, tied embeddings) and Qwen3.5-27B (24 query
    # heads over 4 KV heads, 48 value heads)
    "qwen3.5-0.8b": dict(
        _HYBRID, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320,
        hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        linear_num_value_heads=16, tie_word_embeddings=True),
    "qwen3.5-27b": dict(
        _HYBRID, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320,
        hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
        num_key_value_heads=4, linear_num_value_heads=48),
    # the text model of Qwen3.5-35B-A3B (Qwen3.6-35B-A3B has the same shape)
    "qwen3.5-35b-a3b": dict(
        _HYBRID, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text",
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        intermediate_size=512),
    "qwen2.5-coder-32b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=152064,
        hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, tie_word_embeddings=False, torch_dtype="bfloat16",
        hidden_act="silu", eos_token_id=151643, bos_token_id=151643),
}
# image-text models with their vision towers: the text models above (Qwen3-VL's with mRoPE and a
# 5M rope theta) under text_config, the published towers (27 blocks of 1152, DeepStack after blocks
# 8, 16 and 24 in Qwen3-VL, none in Qwen3.5)
_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3,
               patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
               hidden_act="gelu_pytorch_tanh")
_QWEN3_VL_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                     vision_end_token_id=151653)
_VL_ROPE = dict(rope_theta=5000000.0, max_position_embeddings=262144,
                rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True})


def _image_text(arch: str, model_type: str, text: dict, ids: dict, deepstack: list[int]) -> dict:
    vision = dict(_VISION, out_hidden_size=text["hidden_size"], deepstack_visual_indexes=deepstack,
                  model_type=f"{model_type}_vision" if deepstack else "qwen3_5_vision")
    return dict(architectures=[arch], model_type=model_type, text_config=text, vision_config=vision,
                tie_word_embeddings=text["tie_word_embeddings"], torch_dtype="bfloat16", **ids)


PRESETS["qwen3-vl-8b"] = _image_text(
    "Qwen3VLForConditionalGeneration", "qwen3_vl", dict(PRESETS["qwen3-8b"], **_VL_ROPE), _QWEN3_VL_IDS, [8, 16, 24])
PRESETS["qwen3-vl-30b-a3b"] = _image_text(
    "Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", dict(PRESETS["qwen3-30b-a3b"], **_VL_ROPE),
    _QWEN3_VL_IDS, [8, 16, 24])
PRESETS["qwen3.5-35b-a3b-vl"] = _image_text(
    "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
    dict(PRESETS["qwen3.5-35b-a3b"], rope_scaling={"rope_type": "default", "mrope_section": [11, 11, 10],
                                                   "mrope_interleaved": True}),
    dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053, vision_end_token_id=248054),
    [])
# the small Qwen2.5-Coder models, speculative decoding's drafts (same tokenizer as the 32B)
_CODER = dict(PRESETS["qwen2.5-coder-32b"], vocab_size=151936, tie_word_embeddings=True)
PRESETS["qwen2.5-coder-0.5b"] = dict(_CODER, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                     num_attention_heads=14, num_key_value_heads=2)
PRESETS["qwen2.5-coder-1.5b"] = dict(_CODER, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                     num_attention_heads=12, num_key_value_heads=2)


# the published quantized checkpoints' layouts on those shapes, as `hotpath quantize` writes them:
# NAME-fp8 (Qwen's 128x128 block FP8), NAME-fp8-ptpc (compressed-tensors FP8 per channel, tokens
# dynamic), NAME-awq and NAME-gptq (int4, groups of 128; the published int4 models are float16)
_QUANTIZED = {
    "fp8": lambda: formats.fp8_block_config([]),
    "fp8-ptpc": lambda: formats.fp8_channel_config(["lm_head"]),
    "awq": lambda: formats.awq_config(128, []),
    "gptq": lambda: formats.gptq_config(128, desc_act=False, sym=True, damp_percent=0.01),
}
for _base in ("qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen2.5-coder-32b"):
    for _fmt, _config in _QUANTIZED.items():
        PRESETS[f"{_base}-{_fmt}"] = dict(
            PRESETS[_base], quantization_config=_config(),
            **({"torch_dtype": "float16"} if _fmt in ("awq", "gptq") else {}))


def preset_dir(name: str) -> Path:
    """Writes the preset's config.json into a fresh directory (for load_format="dummy")."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    out = Path(tempfile.mkdtemp(prefix=f"hotpath-{name}-"))
    (out / "config.json").write_text(json.dumps(PRESETS[name], indent=2))
    return out
