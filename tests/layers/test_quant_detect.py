"""Detection of a checkpoint's quantization format from config.json, and its errors."""

import json

import pytest

from hotpath.layers.quant.awq import AwqConfig
from hotpath.layers.quant.detect import SUPPORTED_METHODS, quant_config_from_hf, read_quant_config
from hotpath.layers.quant.fp8_block import Fp8BlockConfig
from hotpath.layers.quant.fp8_channel import Fp8ChannelConfig, Fp8OnlineConfig
from hotpath.layers.quant.gptq import GptqConfig

QWEN_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]}
AWQ = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128, "zero_point": True,
       "modules_to_not_convert": ["visual"]}


def _ct(weights_strategy="channel", input_strategy="token", **extra):
    args = dict(num_bits=8, type="float", symmetric=True)
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {**args, "strategy": weights_strategy, "dynamic": False, **extra},
                                          "input_activations": {**args, "strategy": input_strategy, "dynamic": True}}}}


def test_formats_are_detected():
    assert quant_config_from_hf({}) is None
    assert isinstance(quant_config_from_hf({}, "fp8"), Fp8OnlineConfig)
    fp8 = quant_config_from_hf({"quantization_config": QWEN_FP8})
    assert isinstance(fp8, Fp8BlockConfig) and fp8.block_size == (128, 128)
    assert fp8.scale_name == "weight_scale_inv"
    assert isinstance(quant_config_from_hf({"quantization_config": QWEN_FP8}, "fp8"), Fp8BlockConfig)
    ct = quant_config_from_hf({"quantization_config": _ct()})
    assert isinstance(ct, Fp8ChannelConfig) and ct.ignore.entries == ["lm_head"]
    awq = quant_config_from_hf({"text_config": {"quantization_config": AWQ}})  # nested, composite
    assert isinstance(awq, AwqConfig) and awq.group_size == 128
    assert awq.skips("model.visual.blocks.0.attn.qkv", [])
    gptq = quant_config_from_hf({"quantization_config": {"quant_method": "gptq", "bits": 4,
                                                         "group_size": 64, "desc_act": True}})
    assert isinstance(gptq, GptqConfig) and gptq.group_size == 64 and gptq.v1_zeros


def test_compressed_tensors_fp8_block_scheme():
    qc = _ct("block", "group", block_structure=[128, 128])
    qc["config_groups"]["group_0"]["input_activations"]["group_size"] = 128
    cfg = quant_config_from_hf({"quantization_config": qc})
    assert isinstance(cfg, Fp8BlockConfig) and cfg.scale_name == "weight_scale"


def test_autogptq_quantize_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (tmp_path / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 128, "desc_act": False, "sym": True}))
    assert isinstance(read_quant_config(tmp_path), GptqConfig)


@pytest.mark.parametrize("hf,forced,message", [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, None, "'bitsandbytes' is not supported"),
    ({"quantization_config": {"quant_method": "fp8"}}, None, "without weight_block_size"),
    ({"quantization_config": {**QWEN_FP8, "weight_block_size": [64, 64]}}, None, r"\[64, 64\]"),
    ({"quantization_config": {**QWEN_FP8, "activation_scheme": "static"}}, None, "activation_scheme"),
    ({"quantization_config": QWEN_FP8}, "awq", "does not match"),
    ({}, "awq", "no quantization_config"),
    ({}, "int8", "unknown quantization 'int8'"),
    ({"quantization_config": {**AWQ, "bits": 8}}, None, "bits=8"),
    ({"quantization_config": {**AWQ, "version": "gemv"}}, None, "version 'gemv'"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}}, None, "marlin"),
    ({"quantization_config": _ct("tensor")}, None, "'tensor' weights"),
    ({"quantization_config": {**_ct(), "format": "pack-quantized"}}, None, "pack-quantized"),
])
def test_detection_errors_name_the_problem(hf, forced, message):
    with pytest.raises(ValueError, match=message):
        quant_config_from_hf(hf, forced)


def test_unknown_method_error_lists_the_supported_ones():
    with pytest.raises(ValueError) as e:
        quant_config_from_hf({"quantization_config": {"quant_method": "hqq"}})
    assert all(m in str(e.value) for m in SUPPORTED_METHODS)
