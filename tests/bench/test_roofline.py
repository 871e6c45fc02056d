"""The benchmark presets have the published parameter counts, and the roofline counts the bytes
PERF.md says: every weight once, the embedding only for the looked-up rows, a tied head in full."""

import pytest
import torch

from hotpath.bench.presets import PRESETS
from hotpath.bench.roofline import decode_weight_bytes, kv_bytes_per_token, prefill_flops
from hotpath.models.registry import config_from_hf, get_model_class

# totals on the model cards (rounded there, hence the 1% tolerance)
PUBLISHED_PARAMS = {"qwen3.5-0.8b": 0.8e9, "qwen3.5-27b": 27e9, "qwen3.5-9b": 9e9, "qwen3-next-80b-a3b": 80e9, "qwen3.5-35b-a3b": 35e9, "qwen3-30b-a3b": 30.5e9, "qwen3-235b-a22b": 235e9, "qwen3-0.6b": 0.6e9, "qwen3-8b": 8.2e9, "qwen3-32b": 32.8e9, "qwen2.5-coder-32b": 32.5e9, "qwen2.5-coder-0.5b": 0.49e9, "qwen2.5-coder-1.5b": 1.54e9,
                    # the image-text models, their vision towers included
                    "qwen3-vl-8b": 8.77e9, "qwen3-vl-30b-a3b": 31.1e9, "qwen3.5-35b-a3b-vl": 35e9}


def meta_model(name):
    cfg = config_from_hf(PRESETS[name])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            return cfg, get_model_class(cfg.architecture)(cfg, max_positions=16)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_preset_parameter_counts(name):
    _, model = meta_model(name)
    params = sum(p.numel() for p in model.parameters())
    # Qwen3.5-0.8B's card counts its vision tower, a tenth of so small a model; the preset is the
    # text model
    assert params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.07 if name == "qwen3.5-0.8b" else 0.01)


def test_quantized_presets_store_their_formats_bytes():
    """NAME-fp8 / -fp8-ptpc / -awq / -gptq: the linear layers (not the embedding, LM head and
    norms) hold their format's bytes a weight (fp8: 1 and a scale per block or row; int4: half a
    byte, a 16-bit scale and half a byte of zero point per group of 128), as the loader builds
    them; every preset is one of a published shape in a published layout."""
    from hotpath.layers.quant.base import building_with
    from hotpath.layers.quant.detect import quant_config_from_hf
    from hotpath.loader.quantized import set_layer_methods

    assert all(name.rsplit("-", 1)[0] in PRESETS or name.rsplit("-", 2)[0] in PRESETS
               for name in PRESETS if name not in PUBLISHED_PARAMS)
    cfg, base = meta_model("qwen3-8b")
    base_bytes = decode_weight_bytes(base, cfg, 1)
    linear = sum(p.numel() for n, p in base.named_parameters()
                 if ".layers." in n and not n.endswith("norm.weight"))
    for fmt, per_weight in (("fp8", 1 + 2 / 128**2), ("fp8-ptpc", 1 + 2 / 4096),
                            ("awq", 0.5 + 2.5 / 128), ("gptq", 0.5 + 2.5 / 128)):
        qcfg = config_from_hf(PRESETS[f"qwen3-8b-{fmt}"])
        qcfg.quantization = quant_config_from_hf(PRESETS[f"qwen3-8b-{fmt}"])  # as the engine sets it
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("meta"), building_with(qcfg.quantization):
                model = get_model_class(qcfg.architecture)(qcfg, max_positions=16)
                set_layer_methods(model, qcfg.quantization)
        finally:
            torch.set_default_dtype(old)
        want = base_bytes - 2 * linear + per_weight * linear
        assert decode_weight_bytes(model, qcfg, 1) == pytest.approx(want, rel=0.01), fmt


def test_decode_bytes_count_embedding_rows_only():
    cfg, model = meta_model("qwen3-8b")  # untied: the embedding is not read beyond its rows
    total = sum(p.numel() for p in model.parameters()) * 2
    emb = cfg.vocab_size * cfg.hidden_size * 2
    assert decode_weight_bytes(model, cfg, 1) == total - emb + cfg.hidden_size * 2
    assert decode_weight_bytes(model, cfg, 64) == total - emb + 64 * cfg.hidden_size * 2
    cfg, model = meta_model("qwen3-0.6b")  # tied: the LM head reads the whole shared matrix
    total = sum(p.numel() for p in model.parameters()) * 2
    assert decode_weight_bytes(model, cfg, 1) == total + cfg.hidden_size * 2


def test_kv_and_flops():
    cfg, _ = meta_model("qwen3-8b")
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 36 * 8 * 128 * 2
    # attention FLOPs are half the square (causal) of QK^T and PV
    attn = prefill_flops(cfg, 0, 1000)
    assert attn == pytest.approx(2 * 2 * 36 * 32 * 128 * 1000**2 / 2)
    assert prefill_flops(cfg, 10, 1000) == pytest.approx(attn + 2 * 10 * 1000)


def test_moe_decode_bytes_count_routed_experts_only():
    """Qwen3-30B-A3B: ~3.3B parameters active per token (model card); at batch 1 a decode step
    reads 8 of each layer's 128 experts, and at large batches nearly all of them."""
    from hotpath.bench.roofline import active_params, expected_distinct_experts

    cfg, model = meta_model("qwen3-30b-a3b")
    assert expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(128, 8, 1000) == pytest.approx(128)
    experts = 48 * 128 * 3 * 2048 * 768 * 2  # bytes of every expert of every layer
    total = sum(p.numel() for p in model.parameters()) * 2
    emb = cfg.vocab_size * cfg.hidden_size * 2
    one = decode_weight_bytes(model, cfg, 1)
    assert one == total - emb + cfg.hidden_size * 2 - experts * 120 // 128
    assert 3.0e9 < one / 2 < 3.3e9  # the model card's 3.3B active includes the embedding
    assert decode_weight_bytes(model, cfg, 64) > 3 * one
    assert active_params(model, cfg) == pytest.approx(3.3e9 - 2 * 151936 * 2048, rel=0.02)


def test_hybrid_presets_and_state_bytes():
    """Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B at their published totals (80B, 35B); only the
    full-attention layers hold K/V, and a decode step moves each sequence's recurrent state."""
    from hotpath.bench.roofline import state_bytes_per_sequence

    for name, total in (("qwen3-next-80b-a3b", 80e9), ("qwen3.5-35b-a3b", 35e9)):
        cfg, model = meta_model(name)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(total, rel=0.01)
    cfg, _ = meta_model("qwen3-next-80b-a3b")
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 12 * 2 * 256 * 2  # 12 of 48 layers
    per_layer = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert state_bytes_per_sequence(cfg, torch.bfloat16) == 36 * per_layer
    assert state_bytes_per_sequence(config_from_hf(PRESETS["qwen3-8b"]), torch.bfloat16) == 0


def test_vision_tower_is_not_read_at_decode():
    """An image-text model's decode reads its text model's bytes: Qwen3-VL-8B's text model is
    Qwen3-8B's shape, its tower (0.58B parameters) runs at prefill only."""
    cfg_vl, vl = meta_model("qwen3-vl-8b")
    cfg, text = meta_model("qwen3-8b")
    assert sum(p.numel() for n, p in vl.named_parameters() if n.startswith("visual.")) > 0.5e9
    assert decode_weight_bytes(vl, cfg_vl, 1) == decode_weight_bytes(text, cfg, 1)
