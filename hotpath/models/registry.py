"""Architecture name (config.json "architectures") -> model class."""

from __future__ import annotations

import torch.nn as nn

from hotpath.models.llama import DecoderForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": DecoderForCausalLM,
    "Qwen2ForCausalLM": DecoderForCausalLM,
    "Qwen3ForCausalLM": DecoderForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"supported: {', '.join(MODEL_REGISTRY)}"
        ) from None
