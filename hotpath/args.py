"""EngineArgs: every engine setting in one place, shared by LLM(), the CLI and the server.

Names and defaults follow vLLM's so its users need not relearn them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from typing import Any

from hotpath.config import KV_CACHE_DTYPES, EngineConfig as _Defaults

EXECUTOR_BACKENDS = ("uni", "mp")


def json_object(name: str, value: dict | str) -> dict[str, Any]:
    """An argument given as a dict (LLM(...)) or as its JSON text (the CLI); ValueError naming
    `name` for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict or JSON object, got {type(value).__name__}")
    return dict(value)


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = _Defaults.kv_cache_dtype
    max_model_len: int | None = None
    block_size: int = _Defaults.block_size
    enable_prefix_caching: bool = _Defaults.enable_prefix_caching
    max_num_seqs: int = _Defaults.max_num_seqs
    max_num_batched_tokens: int | None = None  # None: max(_Defaults.max_num_batched_tokens, max_num_seqs)
    seed: int = 0
    skip_tokenizer_init: bool = False
    gpu_memory_utilization: float = _Defaults.gpu_memory_utilization
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    async_scheduling: bool | None = None  # None: on with a GPU, off on the CPU
    state_snapshot_stride: int = _Defaults.state_snapshot_stride
    # {"method": "ngram" | "draft_model" | "mtp", "num_speculative_tokens": k, ...}, or its JSON text
    speculative_config: dict | str | None = None
    # parallelism (vLLM's names): ranks of one model, MoE experts split across them, replicas
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1
    # "uni": the runner in the engine's process (one rank only); "mp": a worker process per rank
    # (None: uni for one rank, mp for more)
    distributed_executor_backend: str | None = None
    # several nodes (torchrun's names): this node's index, how many, and the rendezvous address
    # that node 0 listens on (the engine's control channel listens on master_port + 1)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (one node only)
    # image-text models (vLLM's names): serve the text model alone; the most images / videos a
    # prompt may carry ({"image": 5, "video": 1} or its JSON text); the processor's settings
    # (min_pixels, max_pixels, fps); where local files and URLs may be read from
    language_model_only: bool = False
    limit_mm_per_prompt: dict | str | None = None
    mm_processor_kwargs: dict | str | None = None
    allowed_local_media_path: str | None = None
    allowed_media_domains: list[str] | None = None
    # a structured-output constraint starts after the reply's reasoning block ("qwen3": <think>);
    # `hotpath serve --reasoning-parser` sets it with the server's parser (vLLM's name)
    reasoning_parser: str | None = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("engine")
        g.add_argument("--model", "-m", default=None,
                       help="model to load: a known asset name (qwen2.5-coder-0.5b, "
                            "qwen2.5-coder-1.5b, smollm2-135m), an HF model directory with "
                            "config.json and safetensors, or a .gguf file "
                            "(default: qwen2.5-coder-0.5b, fetched on first use)")
        g.add_argument("--tokenizer", default=None,
                       help="tokenizer directory, if not the model's own")
        g.add_argument("--dtype", default="auto",
                       choices=["auto", "float32", "bfloat16", "float16"],
                       help="weight and activation dtype; auto = float32 on the CPU, the "
                            "checkpoint's dtype (bfloat16 for float32 checkpoints) on a GPU")
        g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
        g.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"],
                       help="dummy = random weights at the model's real shapes (benchmarks)")
        g.add_argument("--quantization", "-q", default=None,
                       choices=["fp8", "compressed-tensors", "awq", "gptq", "gguf"],
                       help="the linear layers' weight format (default: what the checkpoint's "
                            "quantization_config says, else the model dtype). A quantized "
                            "checkpoint's own method may be named; fp8 on a 16-bit checkpoint "
                            "quantizes it while loading (fp8 weights per output channel, "
                            "activations per token); gguf: a GGUF's linear layers, LM head and "
                            "embedding kept in their GGUF types, on the GPU's "
                            "kernels (without it a GGUF runs from a copy dequantized to the run "
                            "dtype)")
        g.add_argument("--kv-cache-dtype", default=_Defaults.kv_cache_dtype, choices=list(KV_CACHE_DTYPES),
                       help="the KV cache's dtype: auto = the model dtype; fp8 = e4m3 (e4m3fnuz "
                            "on AMD MI300), half the bytes of bf16 per token, so twice the "
                            "tokens fit, with a scale per layer for K and one for V from the "
                            "checkpoint (k_scale / v_scale, or compressed-tensors' "
                            "k_proj / v_proj output_scale), 1.0 where it has none")
        g.add_argument("--max-model-len", type=int, default=None,
                       help="context limit in tokens, prompt + output "
                            "(default: the model's max_position_embeddings)")
        g.add_argument("--block-size", type=int, default=_Defaults.block_size, help="tokens per KV cache block")
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=_Defaults.enable_prefix_caching,
                       help="reuse the KV cache of shared prompt prefixes")
        g.add_argument("--max-num-seqs", type=int, default=_Defaults.max_num_seqs,
                       help="most sequences in one batch")
        g.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="token budget of one step; longer prompts are prefilled in chunks "
                            f"(default: {_Defaults.max_num_batched_tokens}, or --max-num-seqs if larger)")
        g.add_argument("--seed", type=int, default=0,
                       help="seed for random sampling without a per-request seed, and dummy weights")
        g.add_argument("--skip-tokenizer-init", action="store_true",
                       help="load no tokenizer; prompts must be token ids")
        g.add_argument("--gpu-memory-utilization", type=float, default=_Defaults.gpu_memory_utilization,
                       help="fraction of GPU memory for weights, activations and KV cache")
        g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="use exactly this many KV cache blocks (testing)")
        g.add_argument("--enforce-eager", action="store_true",
                       help="run decode eagerly instead of replaying captured CUDA graphs")
        g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="schedule and launch the next greedy decode step while the GPU runs "
                            "this one (default: on with a GPU)")
        g.add_argument("--state-snapshot-stride", type=int, default=_Defaults.state_snapshot_stride,
                       help="hybrid models' prefix caching: keep a snapshot of the linear-attention "
                            "state every this many tokens (a multiple of --block-size), besides "
                            "the end of each finished request")

        g.add_argument("--speculative-config", default=None,
                       help='speculative decoding, as JSON: {"method": "ngram", '
                            '"num_speculative_tokens": 4, "prompt_lookup_min": 1, '
                            '"prompt_lookup_max": 4} (drafts looked up in the context) or '
                            '{"method": "draft_model", "model": "qwen2.5-coder-0.5b", '
                            '"num_speculative_tokens": 4} (a smaller model with the same '
                            'tokenizer) or {"method": "mtp", "num_speculative_tokens": 2} (the '
                            'checkpoint\'s own multi-token-prediction head: Qwen3-Next, Qwen3.5); '
                            'output is exactly the target model\'s (default: off)')

        p = parser.add_argument_group("parallelism")
        p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                       help="GPUs (ranks) one model is split over: attention heads, MLP and expert "
                            "widths, the vocabulary; a worker process per rank")
        p.add_argument("--enable-expert-parallel", action="store_true",
                       help="MoE models: split the experts across the tensor-parallel ranks "
                            "(whole experts per rank) instead of each expert's width")
        p.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                       help="hotpath serve: replicas of the engine (each on its own "
                            "--tensor-parallel-size GPUs), requests routed by prompt prefix")
        p.add_argument("--distributed-executor-backend", default=None, choices=list(EXECUTOR_BACKENDS),
                       help="uni: the model runs in the engine's process (one rank); mp: a worker "
                            "process per rank (default: uni for one rank, mp for more)")
        p.add_argument("--nnodes", type=int, default=1,
                       help="nodes the tensor-parallel ranks span (each runs this command with its "
                            "--node-rank; node 0 runs the engine, the others only workers)")
        p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 to --nnodes - 1")
        p.add_argument("--master-addr", default="127.0.0.1",
                       help="the address node 0 listens on for the other nodes' workers (default "
                            "loopback: one node). Set HOTPATH_CLUSTER_SECRET to the same secret on "
                            "every node when --nnodes > 1: workers that do not present it are refused")
        p.add_argument("--master-port", type=int, default=None,
                       help="the rendezvous port on --master-addr (the control channel takes the "
                            "next port); default: a free port, one node only")

        m = parser.add_argument_group("multimodal")
        m.add_argument("--language-model-only", action="store_true",
                       help="image-text models: load and serve the text model only (no vision "
                            "tower; images and videos are refused)")
        m.add_argument("--limit-mm-per-prompt", default=None,
                       help='the most images and videos one prompt may carry, as JSON: '
                            '{"image": 5, "video": 1} (default: 16 images, 2 videos)')
        m.add_argument("--mm-processor-kwargs", default=None,
                       help='image and video preprocessing settings, as JSON: {"min_pixels": 3136, '
                            '"max_pixels": 1003520, "fps": 2} (default: the checkpoint\'s '
                            'preprocessor_config.json)')
        m.add_argument("--allowed-local-media-path", default=None,
                       help="a directory whose files requests may name (file: URLs, paths); "
                            "default: none, local files are refused")
        m.add_argument("--allowed-media-domains", nargs="+", default=None,
                       help="the only hosts that http(s) image and video URLs may name, whatever "
                            "address they resolve to (default: any host whose addresses are all "
                            "public; loopback and private addresses are refused)")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})
