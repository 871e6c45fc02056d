"""Engine arguments resolved once, in one place: the model directory (a GGUF converted), its config
and quantization, the device and dtype, the engine settings, speculative decoding's configs and
the parallel layout. The engine calls `resolve`, and so does each worker process (from the same
EngineArgs, which cross process boundaries as plain data), so both sides derive the same values by
the same code."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from hotpath.args import EXECUTOR_BACKENDS, EngineArgs
from hotpath.config import EngineConfig, ModelConfig
from hotpath.layers.quant.base import QuantConfig
from hotpath.layers.quant.detect import read_quant_config
from hotpath.models.registry import read_config
from hotpath.speculative.config import SpeculativeConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DraftModel:
    config: ModelConfig
    model_dir: Path


@dataclass
class Resolved:
    args: EngineArgs
    device: torch.device
    model_dir: Path
    model_config: ModelConfig
    dtype: torch.dtype
    config: EngineConfig
    spec: SpeculativeConfig | None
    draft: DraftModel | None  # speculative decoding's draft model (method "draft_model")
    executor_backend: str  # "uni" or "mp"

    @property
    def num_speculative_tokens(self) -> int:
        return self.spec.num_speculative_tokens if self.spec is not None else 0


def resolve(args: EngineArgs) -> Resolved:
    device = resolve_device(args.device)
    backend = _check_parallel(args, device)
    model_dir = resolve_model_dir(args.model)
    model_config = read_config(model_dir)
    model_config.quantization = _quant_config(model_dir, args.quantization)
    dtype = _resolve_dtype(args.dtype, model_config, device)
    max_positions = model_config.max_position_embeddings
    max_model_len = args.max_model_len or max_positions
    if max_model_len > max_positions:
        raise ValueError(
            f"max_model_len {max_model_len} is larger than the model's "
            f"max_position_embeddings ({max_positions}): positions past it were never trained"
        )
    if args.language_model_only:
        model_config.multimodal = None
    config = EngineConfig(
        max_model_len=max_model_len,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens
        or max(EngineConfig.max_num_batched_tokens, args.max_num_seqs),
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        state_snapshot_stride=args.state_snapshot_stride,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if model_config.multimodal is not None:  # the RoPE table's rows for one step's visual tokens
        model_config.multimodal = replace(model_config.multimodal, max_step_tokens=config.max_num_batched_tokens)
    spec = SpeculativeConfig.parse(args.speculative_config)
    draft = None
    if spec is not None and spec.method == "draft_model":
        draft_dir = resolve_model_dir(spec.model)
        draft_cfg = read_config(draft_dir)
        draft_cfg.quantization = read_quant_config(draft_dir, None)
        draft = DraftModel(draft_cfg, draft_dir)
    return Resolved(args, device, model_dir, model_config, dtype, config, spec, draft, backend)


def _quant_config(model_dir: Path, quantization: str | None) -> QuantConfig | None:
    """The checkpoint's format (read_quant_config); a converted GGUF's linear layers kept in their
    GGUF types with quantization="gguf", else run from its dequantized copy. (Kept quantized
    becomes the GPU's default once measured there against the copy: docs/decisions.md.)"""
    from hotpath.loader.gguf import GGUF_LINK

    link = model_dir / GGUF_LINK
    if not link.is_symlink():
        if quantization == "gguf":
            raise ValueError("quantization='gguf' needs a GGUF model (a .gguf file, or a known "
                             "model name that is one)")
        return read_quant_config(model_dir, quantization)
    if quantization not in (None, "gguf"):
        raise ValueError(f"quantization={quantization!r} does not apply to a GGUF model (its "
                         "types are its own): leave it unset or pass 'gguf'")
    if quantization == "gguf":
        from hotpath.layers.quant.gguf import GGUFQuantConfig

        return GGUFQuantConfig.from_file(link.resolve())
    return None


def resolve_model_dir(model: str | None) -> Path:
    """A known asset name, an HF directory or a .gguf file -> an HF-style directory."""
    from hotpath.assets import resolve_model

    path = resolve_model(model)
    if path.is_file():
        from hotpath.loader.gguf import gguf_to_hf_dir  # the gguf package only when needed

        return gguf_to_hf_dir(path)
    return path


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA GPU is available")
    return dev


def _resolve_dtype(dtype: str, model_config: ModelConfig, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return model_config.default_dtype(device)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _check_parallel(args: EngineArgs, device: torch.device) -> str:
    """The executor backend, after checking the parallel sizes against each other and the GPUs."""
    for name in ("tensor_parallel_size", "data_parallel_size", "nnodes"):
        value = getattr(args, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    tp, nnodes = args.tensor_parallel_size, args.nnodes
    if not 0 <= args.node_rank < nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes={nnodes}), got {args.node_rank}")
    if tp % nnodes:
        raise ValueError(f"tensor_parallel_size {tp} must be a multiple of nnodes {nnodes} "
                         "(each node runs the same number of ranks)")
    backend = args.distributed_executor_backend or ("uni" if tp == 1 else "mp")
    if backend not in EXECUTOR_BACKENDS:
        raise ValueError(f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS}, got {backend!r}")
    if backend == "uni" and tp > 1:
        raise ValueError(f"tensor_parallel_size {tp} needs a worker process per rank: "
                         "distributed_executor_backend='mp'")
    if device.type == "cuda" and device.index is None:
        local = tp // nnodes
        count = torch.cuda.device_count()
        if local > count:
            raise ValueError(f"tensor_parallel_size {tp} puts {local} ranks on this node, which has "
                             f"{count} GPU{'s' if count != 1 else ''}")
    if args.data_parallel_size > 1:
        raise ValueError("data_parallel_size is for hotpath serve (replicas behind one server); "
                         "offline, run one LLM per replica")
    if args.enable_expert_parallel and tp == 1:
        raise ValueError("enable_expert_parallel splits experts across tensor-parallel ranks: "
                         "set tensor_parallel_size > 1")
    return backend
