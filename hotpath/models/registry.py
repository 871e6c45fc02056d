"""Architecture name (config.json "architectures") -> the model class that serves it, and the
config parsing that class owns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotpath.config import ModelConfig
from hotpath.models.decoder import CausalLM
from hotpath.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from hotpath.models.qwen3_next import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM
from hotpath.models.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from hotpath.models.qwen_vl import (
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
)

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    cls.__name__: cls
    for cls in (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen2MoeForCausalLM,
                Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM,
                Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration,
                Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration)
}

# config.json files without "architectures" name their model_type only
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                "qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM", "qwen3_5": "Qwen3_5ForConditionalGeneration",
                "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration",
                "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration"}


def get_model_class(architecture: str) -> type[CausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"hotpath supports {', '.join(MODEL_REGISTRY)}"
        ) from None


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a config.json's contents, parsed by the family that serves it."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    arch = archs[0] if archs else _MODEL_TYPES.get(model_type or "", f"<model_type {model_type}>")
    if arch not in MODEL_REGISTRY:
        raise ValueError(
            f"unsupported model architecture {arch!r} (model_type {model_type!r}); "
            f"hotpath supports {', '.join(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[arch].config_from_hf(arch, hf)


def read_config(model_dir: str | Path) -> ModelConfig:
    """ModelConfig from model_dir's config.json."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    return config_from_hf(hf)
