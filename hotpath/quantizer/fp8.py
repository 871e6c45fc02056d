"""fp8-block and fp8-ptpc: round-to-nearest fp8 needs no calibration, so the checkpoint streams
through tensor by tensor (the host holds one source tensor and at most one output shard)."""

from __future__ import annotations

from pathlib import Path

import torch

from hotpath.layers.linear import Linear
from hotpath.loader.gguf import weights_dir
from hotpath.loader.safetensors import iterate_safetensors
from hotpath.quantizer import formats
from hotpath.quantizer.plan import plan_quantization
from hotpath.quantizer.writer import ShardedWriter, write_config


def _fits_blocks(layer: Linear) -> bool:
    return all(size % formats.BLOCK == 0 for size in layer.output_sizes[:-1])


def quantize_fp8(source: Path, out: Path, method: str, dtype: torch.dtype, device: torch.device) -> None:
    block = method == "fp8-block"
    plan = plan_quantization(source, _fits_blocks if block else (lambda layer: True), experts=True)
    tensors_of = formats.fp8_block_tensors if block else formats.fp8_channel_tensors
    writer = ShardedWriter(out)
    not_converted, routers = [], []
    for name, tensor in iterate_safetensors(weights_dir(source, dtype), desc=f"quantizing to {method}"):
        model_name = plan.checkpoint_name(name)
        module = name.removesuffix(".weight")
        if model_name in plan.quantized:
            for suffix, t in tensors_of(tensor.to(device), dtype).items():
                writer.add(f"{module}.{suffix}", t)
            continue
        if model_name in plan.kept:
            not_converted.append(module)
        elif model_name in plan.routers:
            routers.append(module)
        writer.add(name, tensor.to(dtype) if tensor.dtype.is_floating_point else tensor)
    writer.close()
    if block:
        config = formats.fp8_block_config(sorted(not_converted))
    else:  # llm-compressor lists the LM head and, for MoE models, the routers
        config = formats.fp8_channel_config(["lm_head", *sorted(routers), *sorted(not_converted)])
    write_config(source, out, config, dtype)
