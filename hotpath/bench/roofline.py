"""Ceilings measured in the same run, and the byte / FLOP counts a step cannot avoid (PERF.md)."""

from __future__ import annotations

import torch
import torch.nn as nn

from hotpath.config import ModelConfig


def _time_cuda(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() over iters runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def measure_bandwidth(device: torch.device, nbytes: int = 4 * 2**30) -> float:
    """HBM bandwidth in bytes/s from a large device-to-device copy, counting read + written."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    return 2 * nbytes / _time_cuda(lambda: dst.copy_(src))


def measure_matmul_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Dense matmul rate in FLOP/s on random data."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    seconds = _time_cuda(lambda: a @ b)
    return 2 * n**3 / seconds


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of experts at least one of `tokens` tokens routes to, each token picking
    top_k of num_experts uniformly (random weights route nearly so)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def decode_weight_bytes(model: nn.Module, cfg: ModelConfig, batch_size: int) -> int:
    """Weight bytes one decode step must read: every parameter once, except the embedding, of
    which only the looked-up rows count (a tied LM head still reads the whole matrix), and the
    stacked MoE experts, of which only those the step's tokens route to count (their expected
    number at this batch size)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.model.embed_tokens.weight
    row_bytes = emb.shape[1] * emb.element_size()
    if not cfg.tie_word_embeddings:
        total -= emb.numel() * emb.element_size()
    if cfg.moe is not None:
        experts = _expert_bytes(model)
        routed = expected_distinct_experts(cfg.moe.num_experts, cfg.moe.top_k, batch_size)
        total -= round(experts * (1 - routed / cfg.moe.num_experts))
    return total + min(batch_size, emb.shape[0]) * row_bytes


def active_params(model: nn.Module, cfg: ModelConfig) -> int:
    """Parameters one token's forward multiplies by: all but the embedding and the LM head, and of
    the MoE experts only the top_k a token routes to."""
    params = sum(p.numel() for p in model.parameters())
    params -= model.model.embed_tokens.weight.numel()
    if not cfg.tie_word_embeddings:
        params -= model.lm_head.weight.numel()
    if cfg.moe is not None:
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        params -= experts - experts * cfg.moe.top_k // cfg.moe.num_experts
    return params


def _expert_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters() if ".experts." in name)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


def prefill_flops(cfg: ModelConfig, active_params: int, prompt_len: int) -> float:
    """2 * params * tokens for the matmuls + causal attention (QK^T and PV, half the square)."""
    attn = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * prompt_len**2 / 2
    return 2 * active_params * prompt_len + attn
