"""The published checkpoint layouts, written: each format's tensors for one linear weight and the
quantization_config its config.json carries. The loaders (hotpath/layers/quant/) read exactly these.

    fp8-block  Qwen's FP8 (Qwen3-8B-FP8): weight F8_E4M3 [N, K], weight_scale_inv [N/128, K/128]
               in the model dtype; {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
               "dynamic", "weight_block_size": [128, 128]}
    fp8-ptpc   compressed-tensors FP8_DYNAMIC (llm-compressor): weight F8_E4M3 [N, K],
               weight_scale [N, 1] in the model dtype; channel weights, dynamic token activations
    awq        AutoAWQ GEMM: qweight I32 [K, N/8] (nibble order 0 2 4 6 1 3 5 7), qzeros I32
               [K/G, N/8], scales F16 [K/G, N]
    gptq       AutoGPTQ v1: qweight I32 [K/8, N], qzeros I32 [K/G, N/8] holding zero - 1, scales
               F16 [K/G, N], g_idx I32 [K]
"""

from __future__ import annotations

from typing import Any

import torch

from hotpath.layers.quant.int4 import AWQ_ORDER, pack_int4

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
BLOCK = 128
COMPRESSED_TENSORS_VERSION = "0.20.0"  # the library version whose config layout is written


def _fp8_with_scale(w: torch.Tensor, amax: torch.Tensor, scale_dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    # the scale is stored in scale_dtype: quantize with the rounded value the loader will read
    scale = (amax / FP8_MAX).clamp(min=1e-12).to(scale_dtype)
    return scale, scale.float()


def fp8_block_tensors(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """w [N, K] -> {"weight": fp8 [N, K], "weight_scale_inv": [ceil(N/128), ceil(K/128)]}."""
    N, K = w.shape
    nb, kb = -(-N // BLOCK), -(-K // BLOCK)
    padded = torch.nn.functional.pad(w.float(), (0, kb * BLOCK - K, 0, nb * BLOCK - N))
    blocks = padded.view(nb, BLOCK, kb, BLOCK)
    stored, scale = _fp8_with_scale(blocks, blocks.abs().amax(dim=(1, 3)), scale_dtype)  # [nb, kb]
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * BLOCK, kb * BLOCK)
    return {"weight": q[:N, :K].to(FP8).contiguous(), "weight_scale_inv": stored}


def fp8_channel_tensors(w: torch.Tensor, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """w [N, K] -> {"weight": fp8 [N, K], "weight_scale": [N, 1]}."""
    wf = w.float()
    stored, scale = _fp8_with_scale(wf, wf.abs().amax(dim=1, keepdim=True), scale_dtype)
    return {"weight": (wf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), "weight_scale": stored}


def awq_tensors(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """q [N, K] (0..15), zeros and scales [N, K/G] -> AWQ's qweight, qzeros, scales."""
    return {"qweight": pack_int4(q.T, AWQ_ORDER), "qzeros": pack_int4(zeros.T, AWQ_ORDER),
            "scales": scales.T.to(torch.float16).contiguous()}


def gptq_tensors(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    """q [N, K] (0..15), zeros and scales [N, K/G], g_idx [K] -> GPTQ v1's tensors."""
    return {"qweight": pack_int4(q).T.contiguous(), "qzeros": pack_int4((zeros.T - 1) & 0xF),
            "scales": scales.T.to(torch.float16).contiguous(), "g_idx": g_idx.to(torch.int32)}


def fp8_block_config(ignored: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                              "weight_block_size": [BLOCK, BLOCK]}
    if ignored:
        config["modules_to_not_convert"] = ignored
    return config


def _ct_args(strategy: str, dynamic: bool, observer: str | None) -> dict[str, Any]:
    return {"actorder": None, "block_structure": None, "dynamic": dynamic, "group_size": None,
            "num_bits": 8, "observer": observer, "observer_kwargs": {}, "scale_dtype": None,
            "strategy": strategy, "symmetric": True, "type": "float", "zp_dtype": None}


def fp8_channel_config(ignored: list[str]) -> dict[str, Any]:
    scheme = {"format": "float-quantized", "input_activations": _ct_args("token", True, None),
              "output_activations": None, "targets": ["Linear"],
              "weights": _ct_args("channel", False, "minmax")}
    return {"config_groups": {"group_0": scheme}, "format": "float-quantized",
            "global_compression_ratio": None, "ignore": ignored, "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed",
            "sparsity_config": {}, "transform_config": {}, "version": COMPRESSED_TENSORS_VERSION}


def awq_config(group_size: int, ignored: list[str]) -> dict[str, Any]:
    return {"bits": 4, "group_size": group_size, "modules_to_not_convert": ignored or None,
            "quant_method": "awq", "version": "gemm", "zero_point": True}


def gptq_config(group_size: int, desc_act: bool, sym: bool, damp_percent: float) -> dict[str, Any]:
    return {"bits": 4, "checkpoint_format": "gptq", "damp_percent": damp_percent,
            "desc_act": desc_act, "group_size": group_size, "model_file_base_name": None,
            "model_name_or_path": None, "quant_method": "gptq", "static_groups": False, "sym": sym,
            "true_sequential": True}
