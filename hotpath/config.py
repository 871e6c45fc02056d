"""Model and engine configuration.

`ModelConfig` holds what the model code needs from an HF `config.json` (GGUF files are first
converted to an HF-style directory by the loader). Parsing belongs to each architecture family
(`CausalLM.config_from_hf` in hotpath/models; `hotpath.models.registry.read_config` finds the
family by the `architectures` name): a family says which features it has, so no feature is
derived from a name elsewhere. The fields every family shares are parsed here
(`ModelConfig.common`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: the CLI's --help reads this module
    import torch


@dataclass(frozen=True)
class MoeConfig:
    """The sparse MLP blocks of a mixture-of-experts model (Qwen2-MoE, Qwen3-MoE)."""

    num_experts: int
    top_k: int  # experts per token (num_experts_per_tok)
    intermediate_size: int  # each expert's (moe_intermediate_size)
    norm_topk_prob: bool  # renormalise the top-k routing weights to sum to 1
    sparse_layers: frozenset[int]  # the layers whose MLP is the sparse block
    shared_expert_intermediate_size: int = 0  # 0: no shared expert


@dataclass(frozen=True)
class LinearAttentionConfig:
    """The Gated DeltaNet layers of a hybrid model (Qwen3-Next, Qwen3.5)."""

    layers: frozenset[int]  # the layers that are linear attention; the rest are full attention
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_width: int  # the causal conv1d's kernel size


@dataclass(frozen=True)
class MultiModalConfig:
    """The vision side of an image-text checkpoint (Qwen3-VL, Qwen3.5): the placeholder tokens
    the processor expands, the tower's config.json section (parsed by hotpath/models/vision.py)
    and the text model's mRoPE sections."""

    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    vision_config: dict[str, Any]
    mrope_section: tuple[int, int, int]  # rotary frequencies for (t, h, w), interleaved
    spatial_merge_size: int  # the tower merges merge x merge patches into one token
    # the most visual tokens one step holds (the engine's max_num_batched_tokens, set by resolve)
    max_step_tokens: int = 8192


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's (of every layer, or of an MoE model's dense layers; 0: none)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # biases on q/k/v
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE
    rope: dict[str, Any]  # HF rope_parameters: rope_type, rope_theta and the type's own keys
    hidden_act: str = "silu"
    torch_dtype: str | None = None
    eos_token_id: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    moe: MoeConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    attn_output_gate: bool = False  # q_proj also emits a sigmoid gate on the attention output
    zero_centred_norms: bool = False  # RMSNorm weights stored as w - 1 (normalise with 1 + w)
    # the multi-token-prediction layers (mtp.*) config.json declares (Qwen3-Next's
    # num_nextn_predict_layers, Qwen3.5's mtp_num_hidden_layers); None: it says nothing
    # (hotpath/models/mtp.py)
    mtp_num_layers: int | None = None
    # the linear layers' format (a hotpath.layers.quant QuantConfig), from the checkpoint's
    # quantization_config or `quantization=`; set by the engine (read_quant_config), None: 16-bit
    quantization: Any = None
    multimodal: MultiModalConfig | None = None  # None: a text-only model (or --language-model-only)

    @classmethod
    def common(cls, arch: str, cfg: dict[str, Any], **family: Any) -> ModelConfig:
        """The fields every family reads the same way; `family` sets the family's own
        (attention_bias, qk_norm, moe, ...)."""
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
        fields = dict(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            # absent from configs whose every MLP is sparse (transformers' Qwen3_5MoeTextConfig)
            intermediate_size=cfg.get("intermediate_size") or 0,
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=bool(cfg.get("attention_bias", False)),
            qk_norm=False,
            rope=_rope_parameters(cfg),
            hidden_act=act,
            torch_dtype=str(dtype) if dtype else None,
            eos_token_id=eos,
            bos_token_id=cfg.get("bos_token_id"),
        )
        config = cls(**{**fields, **family})
        moe = config.moe
        if not config.intermediate_size and (moe is None or len(moe.sparse_layers) < config.num_hidden_layers):
            raise ValueError(f"config.json has no intermediate_size, which {arch}'s dense MLP layers need")
        return config

    def default_dtype(self, device: torch.device) -> torch.dtype:
        """dtype="auto": the checkpoint's dtype on GPUs (fp32 checkpoints run in bf16 there, as
        vLLM does), fp32 on the CPU where bf16 matmuls are slow and fp32 matches the reference."""
        import torch

        if device.type == "cpu":
            return torch.float32
        if self.torch_dtype in ("float16", "torch.float16"):
            return torch.float16
        return torch.bfloat16

    def activation_width(self) -> int:
        """Activation elements per token one layer holds at its peak beyond the hidden states
        (for sizing a step's working memory): the widest of the token mixer's projections and
        outputs and the MLP block's intermediates ([gate | up] and their product; for a sparse
        block that for each of its top_k experts, plus the fp32 sum and the shared expert's)."""
        q = self.num_attention_heads * self.head_dim
        widths = [(3 if self.attn_output_gate else 2) * q + 2 * self.num_key_value_heads * self.head_dim]
        if self.linear_attention is not None:
            lin = self.linear_attention
            key, value = lin.num_k_heads * lin.k_head_dim, lin.num_v_heads * lin.v_head_dim
            # the projections, the conv's output, the recurrence's output
            widths.append(2 * key + 2 * value + 2 * lin.num_v_heads + 2 * key + value + value)
        dense = 3 * self.intermediate_size
        if self.moe is None:
            widths.append(dense)
        else:
            moe = self.moe
            widths.append(moe.top_k * 3 * moe.intermediate_size + 2 * self.hidden_size
                          + 3 * moe.shared_expert_intermediate_size)
            if len(moe.sparse_layers) < self.num_hidden_layers:
                widths.append(dense)
        return max(widths)


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """Normalize the two spellings of RoPE settings: transformers 5's `rope_parameters` and the
    older `rope_theta` + `rope_scaling` that most published config.json files still carry."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params["rope_type"] = rope_type
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return params


# --kv-cache-dtype: "auto" keeps K and V in the model dtype; "fp8" stores them as e4m3 with
# per-layer scales (layers/attention.py)
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass
class EngineConfig:
    """The engine settings the runner needs, resolved from EngineArgs (hotpath/resolve.py). The
    defaults here are the only place they are written: EngineArgs, LLM() and the CLI take them."""

    max_model_len: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    cpu_kv_cache_gib: float = 4.0
    state_snapshot_stride: int = 1024  # tokens (hybrid models' prefix caching)
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
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
        _check_positive("state_snapshot_stride", self.state_snapshot_stride)
        if self.state_snapshot_stride % self.block_size:
            raise ValueError(f"state_snapshot_stride ({self.state_snapshot_stride}) must be a multiple "
                             f"of block_size ({self.block_size})")


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
