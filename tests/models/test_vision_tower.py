"""The vision tower against transformers' Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 vision models on tiny
random checkpoints (CPU, fp32): the merged embeddings and every DeepStack feature, for a batch of
images of different grids and a video."""

import importlib

import pytest
import torch

from hotpath.models.vision import VisionConfig, VisionTower

# two images of different grids and a video of 2 frames: 24 + 64 + 32 patches
GRIDS = [(1, 4, 6), (1, 8, 8), (2, 4, 4)]
TINY = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=4, patch_size=4,
            temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=36)


# family -> transformers' vision config and model classes (in models/<family>/)
HF_CLASSES = {
    "qwen3_vl": ("Qwen3VLVisionConfig", "Qwen3VLVisionModel"),
    "qwen3_vl_moe": ("Qwen3VLMoeVisionConfig", "Qwen3VLMoeVisionModel"),
    "qwen3_5": ("Qwen3_5VisionConfig", "Qwen3_5VisionModel"),
}


def hf_vision_model(family: str, **overrides):
    """A tiny random transformers vision model of `family`, every parameter random (biases and
    norms included, so that a wrong mapping shows)."""
    config_name, model_name = HF_CLASSES[family]
    Config = getattr(importlib.import_module(f"transformers.models.{family}.configuration_{family}"), config_name)
    Model = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), model_name)
    config = Config(**{**TINY, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm_weight = "norm" in name and name.endswith("weight")
            p.copy_(torch.randn_like(p) * (0.2 if p.ndim > 1 else 0.5) + (1.0 if is_norm_weight else 0.0))
    return model


CASES = {
    "qwen3_vl": ("qwen3_vl", dict(deepstack_visual_indexes=[0, 2])),
    # head_dim 36 (no power of two), DeepStack after the last block
    "qwen3_vl_moe_head36": ("qwen3_vl_moe", dict(hidden_size=72, num_heads=2, deepstack_visual_indexes=[1, 3])),
    # the exact GELU in the blocks' MLPs (the released checkpoints use the tanh one)
    "qwen3_5": ("qwen3_5", dict(depth=3, hidden_act="gelu", num_position_embeddings=16)),
}


def our_tower(hf_model) -> VisionTower:
    tower = VisionTower(VisionConfig.from_hf(hf_model.config.to_dict()))
    tower.load_weights(hf_model.state_dict().items())
    return tower


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case):
    family, overrides = CASES[case]
    hf = hf_vision_model(family, **overrides)
    tower = our_tower(hf)
    cfg = tower.config
    num_patches = sum(t * h * w for t, h, w in GRIDS)
    pixels = torch.randn(num_patches, cfg.patch_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(pixels, torch.tensor(GRIDS))
        merged, deepstack = tower(pixels, GRIDS)
    assert merged.shape == (num_patches // 4, cfg.out_hidden_size)
    assert rel_err(merged, want.pooler_output) < 1e-5
    want_deepstack = getattr(want, "deepstack_features", None) or []
    assert len(deepstack) == len(want_deepstack) == len(cfg.deepstack_visual_indexes)
    for got, ref in zip(deepstack, want_deepstack):
        assert got.shape == merged.shape
        assert rel_err(got, ref) < 1e-5


def test_config_from_hf_defaults():
    """An empty vision_config takes transformers' defaults; Qwen3.5's has no DeepStack even where
    its config.json lists indexes (its model ignores them)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    hf = Qwen3VLVisionConfig().to_dict()
    ours = VisionConfig.from_hf({})
    assert ours == VisionConfig.from_hf(hf)
    for name in ("depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels",
                 "patch_size", "spatial_merge_size", "temporal_patch_size", "out_hidden_size",
                 "num_position_embeddings"):
        assert getattr(ours, name) == hf[name], name
    assert list(ours.deepstack_visual_indexes) == hf["deepstack_visual_indexes"]
    assert ours.rope_theta == hf["rope_parameters"]["rope_theta"]
    assert VisionConfig.from_hf(Qwen3_5VisionConfig().to_dict()).deepstack_visual_indexes == ()
    released = {"model_type": "qwen3_5", "deepstack_visual_indexes": []}  # Qwen3.5-27B's, in part
    assert VisionConfig.from_hf(released).deepstack_visual_indexes == ()
    # Qwen3-VL-8B-Instruct's vision_config
    real = VisionConfig.from_hf({"depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
                                 "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304,
                                 "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304,
                                 "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
                                 "temporal_patch_size": 2, "deepstack_visual_indexes": [8, 16, 24]})
    assert real.head_dim == 72 and real.out_hidden_size == 4096


@pytest.mark.parametrize("bad", [dict(num_heads=5), dict(hidden_act="relu"), dict(deepstack_visual_indexes=[4]),
                                 dict(rope_parameters={"rope_type": "default", "rope_theta": 1.0})])
def test_config_errors(bad):
    with pytest.raises(ValueError):
        VisionConfig.from_hf({**TINY, **bad})


def test_bad_checkpoint_raises():
    hf = hf_vision_model("qwen3_vl", deepstack_visual_indexes=[0, 2])
    tower = VisionTower(VisionConfig.from_hf(hf.config.to_dict()))
    weights = dict(hf.state_dict())
    with pytest.raises(ValueError, match="no parameter"):
        tower.load_weights(list(weights.items()) + [("blocks.9.attn.qkv.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        tower.load_weights({**weights, "merger.linear_fc2.weight": torch.zeros(48, 64)}.items())
    with pytest.raises(ValueError, match="unfilled"):
        tower.load_weights((k, v) for k, v in weights.items() if k != "deepstack_merger_list.1.norm.bias")
    with pytest.raises(ValueError, match="pixel_values"):
        tower(torch.zeros(10, tower.config.patch_dim), [(1, 4, 4)])
    with pytest.raises(ValueError, match="multiples"):
        tower(torch.zeros(15, tower.config.patch_dim), [(1, 3, 5)])


def test_flops():
    """The GEMMs and attention counted by hand for one image."""
    cfg = VisionConfig.from_hf(dict(TINY, deepstack_visual_indexes=[1]))
    tower = VisionTower(cfg)
    n, hd, i = 64, 64, 96
    per_layer = 2 * n * hd * (4 * hd + 2 * i) + 4 * n * n * hd
    merger = 2 * (n // 4) * (4 * hd) * (4 * hd + 48)
    assert tower.flops([(1, 8, 8)]) == 2 * n * cfg.patch_dim * hd + cfg.depth * per_layer + 2 * merger
    assert tower.flops([(2, 8, 8)]) == 2 * tower.flops([(1, 8, 8)])
