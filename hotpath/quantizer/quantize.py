"""`hotpath quantize MODEL OUT --method fp8-block|fp8-ptpc|awq|gptq`: a quantized checkpoint in
the published HF layout (formats.py), which hotpath, vLLM and transformers load."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from hotpath.layers.linear import Linear
from hotpath.loader.gguf import weights_dir
from hotpath.loader.safetensors import checkpoint_files
from hotpath.quantizer import formats
from hotpath.quantizer.awq import InputStats, quantize_layer_awq
from hotpath.quantizer.calibration import LayerRunner, calibration_tokens, load_hf_model
from hotpath.quantizer.fp8 import quantize_fp8
from hotpath.quantizer.gptq import SEQUENTIAL_GROUPS, Hessian, gptq_quantize
from hotpath.quantizer.plan import plan_quantization
from hotpath.quantizer.writer import ShardedWriter, write_config

logger = logging.getLogger(__name__)

METHODS = ("fp8-block", "fp8-ptpc", "awq", "gptq")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class QuantizeOptions:
    method: str
    group_size: int = 128  # awq, gptq
    desc_act: bool = False  # gptq
    sym: bool = True  # gptq
    damp_percent: float = 0.01  # gptq
    calibration: str = "humaneval"  # awq, gptq
    num_samples: int = 64
    seq_len: int = 512
    clip: bool = True  # awq's clipping search
    scale_search: bool = True  # awq's activation-aware scales; without them and clip: round to nearest
    dtype: str | None = None  # of the unquantized tensors; default by method
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.group_size != -1 and self.group_size < 8:
            raise ValueError(f"group_size must be -1 or at least 8, got {self.group_size}")
        if not 0 <= self.damp_percent < 1:
            raise ValueError(f"damp_percent must be in [0, 1), got {self.damp_percent}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(_DTYPES)}")


def quantize(model: str, out: str | Path, options: QuantizeOptions) -> Path:
    """Writes `model` (a known name, an HF directory or a .gguf) quantized into `out` (created;
    it must not exist or be empty); returns its path."""
    from hotpath.resolve import resolve_model_dir

    source = resolve_model_dir(model)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"output directory {out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    # published fp8 checkpoints keep bf16 for the rest, AWQ and GPTQ fp16
    default = "bfloat16" if options.method.startswith("fp8") else "float16"
    dtype = _DTYPES[options.dtype or default]
    device = torch.device(options.device)
    try:
        if options.method.startswith("fp8"):
            quantize_fp8(source, out, options.method, dtype, device)
        else:
            _quantize_int4(source, out, options, dtype, device)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def _int4_fits(group_size: int):
    def fits(layer: Linear) -> bool:
        G = layer.in_features if group_size == -1 else group_size
        return layer.in_features % G == 0 and all(size % 8 == 0 for size in layer.output_sizes)
    return fits


def _quantize_int4(source: Path, out: Path, options: QuantizeOptions, dtype: torch.dtype,
                   device: torch.device) -> None:
    plan = plan_quantization(source, _int4_fits(options.group_size), experts=False)
    if any(".experts." in name for name in plan.kept):
        raise ValueError(f"{options.method}: hotpath quantize does not quantize MoE experts to int4 "
                         "(their calibration needs each expert's routed tokens); use --method "
                         "fp8-block or fp8-ptpc for MoE models")
    if plan.kept:
        raise ValueError(f"{options.method} with group_size {options.group_size} cannot quantize "
                         f"{sorted(plan.kept)[:3]}...: inputs must be whole groups and outputs "
                         "multiples of 8; choose another --group-size")
    hf = load_hf_model(source, torch.float32, device)
    vocab = hf.config.get_text_config().vocab_size
    tokens = calibration_tokens(source, options.calibration, options.num_samples, options.seq_len,
                                vocab, options.seed)
    runner = LayerRunner(hf, tokens)
    writer = ShardedWriter(out)
    written = set()
    for i, layer in enumerate(runner.layers):
        G = options.group_size if options.group_size != -1 else layer.self_attn.q_proj.in_features
        if options.method == "awq":
            tensors = _awq_layer(runner, i, layer, G, options.clip, options.scale_search)
        else:
            tensors = _gptq_layer(runner, i, layer, G, options)
        for name, t in tensors.items():
            writer.add(f"model.layers.{i}.{name}", t)
            written.add(f"model.layers.{i}.{name}")
        runner.advance(runner.run(i))
        logger.info("quantized layer %d of %d", i + 1, len(runner.layers))
    # everything else as the (AWQ: rescaled) HF model holds it, under the source's names; a
    # quantized linear's bias too (Qwen2's q/k/v), which both formats keep beside qweight
    state = hf.state_dict()
    for name in _tensor_names(weights_dir(source, torch.float32)):
        module, _, suffix = name.rpartition(".")
        if suffix == "weight" and f"{module}.qweight" in written:
            continue
        writer.add(name, state[name].to(dtype))
    writer.close()
    if options.method == "awq":
        config = formats.awq_config(options.group_size, [])
    else:
        config = formats.gptq_config(options.group_size, options.desc_act, options.sym,
                                     options.damp_percent)
    write_config(source, out, config, dtype)


def _awq_layer(runner: LayerRunner, i: int, layer: nn.Module, G: int, clip: bool,
               scale_search: bool) -> dict[str, torch.Tensor]:
    from hotpath.quantizer.awq import LOSS_TOKENS, SCALED_PAIRS

    chunks = len(runner.inputs)
    stats = {names[0]: InputStats(-(-LOSS_TOKENS // chunks), seed=i) for _, names in SCALED_PAIRS}
    runner.run(i, {layer.get_submodule(n): st.add for n, st in stats.items()})
    out = {}
    for name, (q, zeros, scales) in quantize_layer_awq(layer, stats, G, clip, scale_search).items():
        for suffix, t in formats.awq_tensors(q, zeros, scales).items():
            out[f"{name}.{suffix}"] = t
    return out


def _gptq_layer(runner: LayerRunner, i: int, layer: nn.Module, G: int, options: QuantizeOptions
                ) -> dict[str, torch.Tensor]:
    out = {}
    for names in SEQUENTIAL_GROUPS:
        hessian = Hessian()
        runner.run(i, {layer.get_submodule(names[0]): hessian.add})
        for name in names:
            lin = layer.get_submodule(name)
            q, zeros, scales, g_idx, deq = gptq_quantize(lin.weight, hessian.h, G, options.desc_act,
                                                         options.sym, options.damp_percent)
            with torch.no_grad():
                lin.weight.copy_(deq.to(lin.weight.dtype))
            for suffix, t in formats.gptq_tensors(q, zeros, scales, g_idx).items():
                out[f"{name}.{suffix}"] = t
    return out


def _tensor_names(model_dir: Path) -> list[str]:
    from safetensors import safe_open

    names = []
    for f in checkpoint_files(model_dir):
        with safe_open(str(f), framework="pt") as h:
            names.extend(h.keys())
    return names
