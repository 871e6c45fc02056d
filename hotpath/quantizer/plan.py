"""Which checkpoint tensors a method quantizes: the weights of hotpath's own Linear layers (and,
for fp8, of MoE experts), found by building the model on the meta device. MoE routers stay in the
model dtype, as the loaders keep them; so does a fused layer whose parts the format cannot stack
(fp8 blocks: parts of 128 output rows; int4: parts of 8 outputs and inputs in whole groups),
which the checkpoint then lists as not converted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hotpath.layers.linear import Linear
from hotpath.layers.moe import FusedExperts, SparseMoeBlock
from hotpath.models.registry import get_model_class, read_config


@dataclass
class QuantPlan:
    quantized: set[str]  # model-side names of the weights to quantize
    kept: set[str]  # model-side names of linear weights left in the model dtype
    routers: set[str]  # model-side names of the MoE routers' weights
    checkpoint_name: Callable[[str], str | None]  # checkpoint tensor name -> model-side name


def plan_quantization(model_dir: Path, fits: Callable[[Linear], bool], experts: bool) -> QuantPlan:
    cfg = read_config(model_dir)
    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg, 16)
    routers = {f"{name}.{gate}" for name, m in model.named_modules() if isinstance(m, SparseMoeBlock)
               for gate in ("gate", "shared_expert_gate")}
    quantized, kept, router_weights = set(), set(), set()
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            weights = {n for n in module.checkpoint_tensors(name) if n.endswith(".weight")}
            if name in routers:
                router_weights |= weights
            else:
                (quantized if fits(module) else kept).update(weights)
        elif isinstance(module, FusedExperts):
            (quantized if experts else kept).update(module.checkpoint_tensors(name))
    return QuantPlan(quantized, kept, router_weights, model.checkpoint_name)
