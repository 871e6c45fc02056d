"""config.json's `quantization_config` (or `--quantization`) -> the QuantConfig its layers load with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotpath.layers.quant.awq import AwqConfig
from hotpath.layers.quant.base import QuantConfig
from hotpath.layers.quant.fp8_block import Fp8BlockConfig
from hotpath.layers.quant.fp8_channel import Fp8ChannelConfig, Fp8OnlineConfig
from hotpath.layers.quant.gptq import GptqConfig
from hotpath.layers.quant.ignore import IgnoreList

# the quant_method values hotpath reads; `quantization=` takes these names too
SUPPORTED_METHODS = ("fp8", "compressed-tensors", "awq", "gptq")


def find_quantization_config(hf: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's quantization_config: top level, or nested in a composite model's text_config."""
    qc = hf.get("quantization_config")
    if qc is None and isinstance(hf.get("text_config"), dict):
        qc = hf["text_config"].get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise ValueError(f"quantization_config must be an object, got {type(qc).__name__}")
    return qc


def quant_config_from_hf(hf: dict[str, Any], quantization: str | None = None) -> QuantConfig | None:
    """The QuantConfig for a config.json's contents; `quantization` forces a method (it must match
    a quantized checkpoint's; "fp8" on a 16-bit checkpoint quantizes it while loading)."""
    if quantization is not None and quantization not in SUPPORTED_METHODS:
        raise ValueError(f"unknown quantization {quantization!r}; hotpath supports "
                         f"{', '.join(SUPPORTED_METHODS)}")
    qc = find_quantization_config(hf)
    if qc is None:
        if quantization in (None, "fp8"):
            return None if quantization is None else Fp8OnlineConfig()
        raise ValueError(
            f"quantization={quantization!r} needs a checkpoint quantized with it, and this one has "
            "no quantization_config; make one with `hotpath quantize MODEL OUT --method ...`, or "
            "pass quantization='fp8', which quantizes a 16-bit checkpoint while loading")
    method = str(qc.get("quant_method", "")).lower()
    if method not in SUPPORTED_METHODS:
        raise ValueError(f"the checkpoint's quantization method {method or '(none)'!r} is not "
                         f"supported; hotpath reads {', '.join(SUPPORTED_METHODS)}")
    if quantization is not None and quantization != method:
        raise ValueError(f"the checkpoint is quantized with {method!r} (its quantization_config), "
                         f"which quantization={quantization!r} does not match; leave quantization "
                         f"unset or pass {method!r}")
    return _PARSERS[method](qc)


def read_quant_config(model_dir: str | Path, quantization: str | None = None) -> QuantConfig | None:
    """quant_config_from_hf for a model directory's config.json; AutoGPTQ's quantize_config.json
    where config.json has no quantization_config."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    hf = json.loads(path.read_text()) if path.is_file() else {}
    side = model_dir / "quantize_config.json"
    if find_quantization_config(hf) is None and side.is_file():
        hf = {**hf, "quantization_config": {"quant_method": "gptq", **json.loads(side.read_text())}}
    return quant_config_from_hf(hf, quantization)


def _int4_fields(qc: dict[str, Any], method: str) -> int:
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{method} with bits={bits!r} is not supported; hotpath reads 4-bit {method}")
    group_size = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(group_size, int) or (group_size < 1 and group_size != -1):
        raise ValueError(f"{method} group_size must be a positive integer or -1, got {group_size!r}")
    return group_size


def _awq(qc: dict[str, Any]) -> AwqConfig:
    group_size = _int4_fields(qc, "awq")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r} is not supported; hotpath reads version 'gemm'")
    if not qc.get("zero_point", True):
        raise ValueError("AWQ without zero points (zero_point: false) is not supported")
    return AwqConfig(group_size, IgnoreList(qc.get("modules_to_not_convert") or [], substrings=True))


def _gptq(qc: dict[str, Any]) -> GptqConfig:
    group_size = _int4_fields(qc, "gptq")
    return GptqConfig(group_size, str(qc.get("checkpoint_format") or "gptq").lower())


def _fp8(qc: dict[str, Any]) -> Fp8BlockConfig:
    block = qc.get("weight_block_size")
    if block is None:
        raise ValueError("fp8 checkpoints without weight_block_size (one scale per tensor) are not "
                         "supported; hotpath reads block-scaled fp8 (weight_block_size [128, 128])")
    if list(block) != [128, 128]:
        raise ValueError(f"fp8 weight_block_size {block} is not supported; hotpath reads [128, 128]")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"fp8 activation_scheme {scheme!r} is not supported; hotpath quantizes "
                         "activations dynamically")
    ignored = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
    return Fp8BlockConfig((128, 128), IgnoreList(ignored))


def _compressed_tensors(qc: dict[str, Any]) -> QuantConfig:
    fmt = qc.get("format")
    if fmt != "float-quantized":
        raise ValueError(f"compressed-tensors format {fmt!r} is not supported; hotpath reads "
                         "'float-quantized' (FP8)")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors checkpoints with {len(groups)} config_groups are not "
                         "supported; hotpath reads one scheme for every Linear")
    (scheme,) = groups.values()
    if scheme.get("targets") != ["Linear"]:
        raise ValueError(f"compressed-tensors targets {scheme.get('targets')} are not supported; "
                         "hotpath reads schemes that target ['Linear']")
    weights, inputs = scheme.get("weights") or {}, scheme.get("input_activations") or {}
    for args, what in ((weights, "weights"), (inputs, "input_activations")):
        if args.get("type") != "float" or args.get("num_bits") != 8 or not args.get("symmetric", True):
            raise ValueError(f"compressed-tensors {what} {args} are not supported; hotpath reads "
                             "symmetric 8-bit float (FP8) weights and activations")
    if weights.get("dynamic") or not inputs.get("dynamic"):
        raise ValueError("compressed-tensors FP8 with static activation scales is not supported; "
                         "hotpath reads static weight scales with dynamic activations")
    ignore = IgnoreList(qc.get("ignore") or [])
    strategy = weights.get("strategy")
    if strategy == "channel" and inputs.get("strategy") == "token":
        return Fp8ChannelConfig(ignore)
    if strategy == "block" and list(weights.get("block_structure") or []) == [128, 128] \
            and inputs.get("strategy") == "group" and inputs.get("group_size") == 128:
        return Fp8BlockConfig((128, 128), ignore, scale_name="weight_scale", name="compressed-tensors")
    raise ValueError(f"compressed-tensors FP8 with {strategy!r} weights and {inputs.get('strategy')!r} "
                     "activations is not supported; hotpath reads channel weights with token "
                     "activations (FP8_DYNAMIC) and 128x128 blocks with 128-group activations (FP8_BLOCK)")


_PARSERS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "awq": _awq, "gptq": _gptq}
