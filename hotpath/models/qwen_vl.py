"""The Qwen image-text checkpoints: Qwen3-VL (dense and MoE) and Qwen3.5 (dense and MoE).

Each nests a text model (config under `text_config`, weights under `model.language_model.`) and a
vision tower (`vision_config`, `model.visual.`; hotpath/models/vision.py). The text model is the
family's own (Qwen3, Qwen3-MoE, the Qwen3.5 hybrids) with mRoPE: three position ids a token
(time, height, width), equal for text (hotpath/layers/rotary.py). The tower's embeddings replace
the image and video placeholder tokens' embeddings; Qwen3-VL also adds its DeepStack features to
those tokens' hidden states after the first layers (hotpath/models/decoder.py). Built with
`language_model_only` (resolve() drops `multimodal` from the config), the model is its text model
alone and the tower's weights are skipped.

Qwen3-VL-MoE checkpoints store each layer's experts fused: the published ones as
`mlp.experts.gate_up_proj` [E, H, 2I] and `mlp.experts.down_proj` [E, I, H], those transformers 5
writes transposed ([E, 2I, H], [E, H, I]); told apart by shape as transformers does, they load as
one tensor per expert and projection (`split_fused_experts`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch

from hotpath.config import ModelConfig, MultiModalConfig
from hotpath.layers.linear import WeightLoaders
from hotpath.models.llama import Qwen3ForCausalLM
from hotpath.models.mtp import split_fused_experts
from hotpath.models.qwen3_next import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM
from hotpath.models.qwen_moe import Qwen3MoeForCausalLM
from hotpath.models.vision import VisionConfig, VisionTower

logger = logging.getLogger("hotpath")

_VISUAL = "model.visual."
_TEXT = "model.language_model."
# composite-level keys the text model takes where its own section does not set them
_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
_INHERITED = ("eos_token_id", "bos_token_id", "torch_dtype", "dtype", "mtp_num_hidden_layers")


class VisionLanguage:
    """A text family (the next base class) inside an image-text checkpoint, with its tower."""

    # transformers' defaults where config.json does not say: the rotary frequencies for (t, h,
    # w), and the placeholder ids (image, video, vision start, vision end)
    MROPE_SECTION: ClassVar[tuple[int, int, int]]
    TOKEN_IDS: ClassVar[tuple[int, int, int, int]]

    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        text = dict(hf.get("text_config") or {})
        if not text:
            raise ValueError(f"{arch} config.json has no text_config")
        if "tie_word_embeddings" in hf:  # the composite model's setting, which HF's tying follows
            text["tie_word_embeddings"] = hf["tie_word_embeddings"]
        for key in _INHERITED:
            if key in hf and key not in text:
                text[key] = hf[key]
        cfg = super().config_from_hf(arch, text)
        vision = hf.get("vision_config") or {}  # absent: transformers' defaults, as its config class
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        section = tuple(rope.get("mrope_section") or cls.MROPE_SECTION)
        if len(section) != 3 or not all(isinstance(n, int) and n >= 0 for n in section):
            raise ValueError(f"mrope_section must be three sizes (t, h, w), got {list(section)}")
        ids = {key: hf.get(key, default) for key, default in zip(_TOKEN_KEYS, cls.TOKEN_IDS)}
        cfg.multimodal = MultiModalConfig(
            **ids, vision_config=dict(vision), mrope_section=section,
            spatial_merge_size=vision.get("spatial_merge_size", 2),
        )
        return cfg

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        mm = cfg.multimodal
        self.visual = None if mm is None else VisionTower(VisionConfig.from_hf(mm.vision_config))
        self._skipped_tower_logged = False

    def checkpoint_name(self, name: str) -> str | None:
        if name.startswith(_VISUAL):
            if self.visual is None and not self._skipped_tower_logged:
                self._skipped_tower_logged = True
                logger.info("skipping the checkpoint's vision tower (%s*): language_model_only", _VISUAL)
            return None if self.visual is None else "visual." + name.removeprefix(_VISUAL)
        name = super().checkpoint_name(name)
        return None if name is None else name.replace(_TEXT, "model.", 1)

    def weight_loaders(self) -> WeightLoaders:
        loaders = {name: load for name, load in super().weight_loaders().items() if not name.startswith("visual.")}
        if self.visual is not None:  # the tower's own loaders (its patch embedding's Conv3d weight)
            loaders.update({f"visual.{name}": load for name, load in self.visual.weight_loaders().items()})
        return loaders

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self.text_weights(weights))

    def text_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors as the text family loads them (the tower's pass as they are)."""
        return weights


class _Qwen3VL(VisionLanguage):
    MROPE_SECTION = (24, 20, 20)
    TOKEN_IDS = (151655, 151656, 151652, 151653)


class _Qwen3_5VL(VisionLanguage):
    MROPE_SECTION = (11, 11, 10)
    TOKEN_IDS = (248056, 248057, 248053, 248054)


class Qwen3VLForConditionalGeneration(_Qwen3VL, Qwen3ForCausalLM):
    pass


class Qwen3VLMoeForConditionalGeneration(_Qwen3VL, Qwen3MoeForCausalLM):

    @classmethod
    def config_from_hf(cls, arch: str, hf: dict[str, Any]) -> ModelConfig:
        text = hf.get("text_config")
        if text:  # its router always renormalises the top-k weights (the config has no such key)
            hf = {**hf, "text_config": {"norm_topk_prob": True, **text}}
        return super().config_from_hf(arch, hf)

    def text_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        h, i = self.config.hidden_size, self.config.moe.intermediate_size
        ours = {"gate_up_proj": (2 * i, h), "down_proj": (h, i)}

        def oriented() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                proj = name.rpartition(".")[2]
                fused = tensor.dim() == 3 and ".mlp.experts." in name and proj in ours
                if fused and tuple(tensor.shape[1:]) != ours[proj]:  # the published [E, H, 2I] / [E, I, H]
                    tensor = tensor.transpose(1, 2)
                yield name, tensor

        return split_fused_experts(oriented())


class Qwen3_5ForConditionalGeneration(_Qwen3_5VL, Qwen3_5ForCausalLM):
    pass


class Qwen3_5MoeForConditionalGeneration(_Qwen3_5VL, Qwen3_5MoeForCausalLM):
    pass
