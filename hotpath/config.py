"""Model and engine configuration.

`ModelConfig` is read from an HF `config.json` (GGUF files are first converted to an HF-style
directory by the loader, so this is the one place model hyper-parameters are parsed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    rope: dict[str, Any]  # HF rope_parameters: rope_type, rope_theta and the type's own keys
    hidden_act: str = "silu"
    torch_dtype: str | None = None
    eos_token_id: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(cfg.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported model architecture {arch!r} (model_type {cfg.get('model_type')!r}); "
                f"hotpath supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' is supported")
        eos = cfg.get("eos_token_id")
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias is set.
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            rope=_rope_parameters(cfg),
            hidden_act=act,
            torch_dtype=str(dtype) if dtype else None,
            eos_token_id=eos,
            bos_token_id=cfg.get("bos_token_id"),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(cfg)

    def default_dtype(self, device: torch.device) -> torch.dtype:
        """dtype="auto": the checkpoint's dtype on GPUs (fp32 checkpoints run in bf16 there, as
        vLLM does), fp32 on the CPU where bf16 matmuls are slow and fp32 matches the reference."""
        if device.type == "cpu":
            return torch.float32
        if self.torch_dtype in ("float16", "torch.float16"):
            return torch.float16
        return torch.bfloat16


def _arch_from_model_type(model_type: str | None) -> str:
    return {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }.get(model_type or "", f"<model_type {model_type}>")


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """Normalize the two spellings of RoPE settings: transformers 5's `rope_parameters` and the
    older `rope_theta` + `rope_scaling` that most published config.json files still carry."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params["rope_type"] = rope_type
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return params


@dataclass
class EngineConfig:
    max_model_len: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    cpu_kv_cache_gib: float = 4.0

    def __post_init__(self) -> None:
        _check_positive("max_model_len", self.max_model_len)
        _check_positive("block_size", self.block_size)
        _check_positive("max_num_seqs", self.max_num_seqs)
        _check_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_gpu_blocks_override is not None:
            _check_positive("num_gpu_blocks_override", self.num_gpu_blocks_override)


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
