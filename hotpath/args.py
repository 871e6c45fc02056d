"""EngineArgs: every engine setting in one place, shared by LLM(), the CLI and the server.

Names and defaults follow vLLM's so its users need not relearn them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from hotpath.config import KV_CACHE_DTYPES


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    seed: int = 0
    skip_tokenizer_init: bool = False
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    async_scheduling: bool | None = None  # None: on with a GPU, off on the CPU
    state_snapshot_stride: int = 1024
    # {"method": "ngram" | "draft_model" | "mtp", "num_speculative_tokens": k, ...}, or its JSON text
    speculative_config: dict | str | None = None

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
                       choices=["fp8", "compressed-tensors", "awq", "gptq"],
                       help="the linear layers' weight format (default: what the checkpoint's "
                            "quantization_config says, else the model dtype). A quantized "
                            "checkpoint's own method may be named; fp8 on a 16-bit checkpoint "
                            "quantizes it while loading (fp8 weights per output channel, "
                            "activations per token)")
        g.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                       help="the KV cache's dtype: auto = the model dtype; fp8 = e4m3 (e4m3fnuz "
                            "on AMD MI300), half the bytes of bf16 per token, so twice the "
                            "tokens fit, with a scale per layer for K and one for V from the "
                            "checkpoint (k_scale / v_scale, or compressed-tensors' "
                            "k_proj / v_proj output_scale), 1.0 where it has none")
        g.add_argument("--max-model-len", type=int, default=None,
                       help="context limit in tokens, prompt + output "
                            "(default: the model's max_position_embeddings)")
        g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=True, help="reuse the KV cache of shared prompt prefixes")
        g.add_argument("--max-num-seqs", type=int, default=256,
                       help="most sequences in one batch")
        g.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="token budget of one step; longer prompts are prefilled in chunks "
                            "(default 8192)")
        g.add_argument("--seed", type=int, default=0,
                       help="seed for random sampling without a per-request seed, and dummy weights")
        g.add_argument("--skip-tokenizer-init", action="store_true",
                       help="load no tokenizer; prompts must be token ids")
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="fraction of GPU memory for weights, activations and KV cache")
        g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="use exactly this many KV cache blocks (testing)")
        g.add_argument("--enforce-eager", action="store_true",
                       help="run decode eagerly instead of replaying captured CUDA graphs")
        g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="schedule and launch the next greedy decode step while the GPU runs "
                            "this one (default: on with a GPU)")
        g.add_argument("--state-snapshot-stride", type=int, default=1024,
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

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})
