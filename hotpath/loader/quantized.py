"""Quantized models at load time: which layers keep the model dtype, and the conversion of every
quantized layer's checkpoint layout into its kernels' layout once the weights are in.

The model is built inside `building_with(config)` (hotpath/layers/quant/base.py), so each Linear is
born on the device with its format's parameters; `set_layer_methods` then resets, by module name,
the layers the format leaves in the model dtype: MoE routers (and Qwen2-MoE's shared-expert gate),
and the checkpoint's ignore / modules_to_not_convert lists; and gives each layer its method where
the format decides per layer (a GGUF's per-tensor types: layers/quant/gguf.py), the LM head and
embedding included where the format stores them quantized (a GGUF's; a tied head shares the
embedding's); norms have no linear method."""

from __future__ import annotations

import torch.nn as nn

from hotpath.layers.linear import Linear, UnquantizedLinearMethod
from hotpath.layers.moe import FusedExperts, SparseMoeBlock
from hotpath.layers.embedding import LMHead, VocabEmbedding, VocabParallel
from hotpath.layers.quant.base import LinearMethod, QuantConfig


def set_layer_methods(model: nn.Module, config: QuantConfig) -> None:
    """Layers the format leaves in the model dtype get the plain method, and layers whose method
    the format decides by name get theirs (before any loading)."""
    ignore = getattr(config, "ignore", None)
    checkpoint_name = getattr(model, "checkpoint_name", None)
    if ignore is not None and checkpoint_name is not None:
        ignore.map_names(checkpoint_name)
    routers = set()
    for name, module in model.named_modules():
        if isinstance(module, SparseMoeBlock):
            routers.add(f"{name}.gate")
            routers.add(f"{name}.shared_expert_gate")
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and not isinstance(module.method, UnquantizedLinearMethod):
            parent = name.rpartition(".")[0]
            shards = [f"{parent}.{c}" if parent else c for c in module.checkpoint_names or []]
            if name in routers or config.skips(name, shards or [name]):
                module.set_method(UnquantizedLinearMethod())
            elif (method := config.method_for(name, shards or [name])) is not None:
                module.set_method(method)
        elif isinstance(module, VocabParallel) and not (tied and isinstance(module, LMHead)):
            method = config.method_for(name, [name])
            if method is not None and not isinstance(method, UnquantizedLinearMethod):
                module.set_method(method)
        elif isinstance(module, FusedExperts) and module.checkpoint_quant is not None:
            if config.skips(name, []):
                module.checkpoint_quant = None
    if tied:  # a tied LM head takes the embedding's matrix in whatever format it got
        embeddings = [m for m in model.modules() if isinstance(m, VocabEmbedding) and m.method is not None]
        for head in (m for m in model.modules() if isinstance(m, LMHead)):
            if embeddings:
                head.share_method(embeddings[0])


def finish_loading(model: nn.Module) -> None:
    """Every layer's method (Linear's, a quantized LM head's) converts what it loaded into the
    layout it runs."""
    for module in model.modules():
        if isinstance(getattr(module, "method", None), LinearMethod):
            module.method.process_weights_after_loading(module)
