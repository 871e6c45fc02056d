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
    number at this batch size). An image-text model's vision tower runs at prefill only."""
    total = sum(p.numel() * p.element_size() for p in _language_model_params(model))
    emb = model.model.embed_tokens
    emb_bytes = sum(p.numel() * p.element_size() for p in emb.parameters(recurse=False))
    rows = emb.vocab_size if emb.method is not None else emb.weight.shape[0]
    row_bytes = emb_bytes // rows  # in its format (a GGUF's: its blocks)
    if not cfg.tie_word_embeddings:
        total -= emb_bytes
    if cfg.moe is not None:
        experts = _expert_bytes(model)
        routed = expected_distinct_experts(cfg.moe.num_experts, cfg.moe.top_k, batch_size)
        total -= round(experts * (1 - routed / cfg.moe.num_experts))
    return total + min(batch_size, rows) * row_bytes


def active_params(model: nn.Module, cfg: ModelConfig) -> int:
    """Parameters one token's forward multiplies by: all but the embedding and the LM head, and of
    the MoE experts only the top_k a token routes to (the vision tower's: its own FLOP count)."""
    params = sum(_weights(module) for name, module in model.named_modules() if not name.startswith("visual"))
    params -= _weights(model.model.embed_tokens)
    if not cfg.tie_word_embeddings:
        params -= _weights(model.lm_head)
    if cfg.moe is not None:
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        params -= experts - experts * cfg.moe.top_k // cfg.moe.num_experts
    return params


def _weights(module: nn.Module) -> int:
    """The weights a module's own parameters hold: a linear layer's (the LM head's) in x out,
    whatever its format packs them into, else its parameters' elements."""
    from hotpath.layers.embedding import LMHead
    from hotpath.layers.linear import Linear

    if isinstance(module, Linear) or (isinstance(module, LMHead) and module.method is not None):
        bias = getattr(module, "bias", None)
        return module.in_features * sum(module.output_sizes) + (bias.numel() if bias is not None else 0)
    return sum(p.numel() for p in module.parameters(recurse=False))


def _language_model_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for name, p in model.named_parameters() if not name.startswith("visual.")]


def _expert_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters() if ".experts." in name)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """K and V bytes one token takes in the cache: the full-attention layers' (a hybrid model's
    linear-attention layers keep none)."""
    layers = cfg.num_hidden_layers - (len(cfg.linear_attention.layers) if cfg.linear_attention else 0)
    return 2 * layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize


def state_bytes_per_sequence(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """A hybrid model's linear-attention state of one sequence, every layer's (0 for others):
    the fp32 recurrent state and the conv state. A decode step reads and writes it once."""
    lin = cfg.linear_attention
    if lin is None:
        return 0
    recurrent = lin.num_v_heads * lin.k_head_dim * lin.v_head_dim * 4
    conv = (2 * lin.num_k_heads * lin.k_head_dim + lin.num_v_heads * lin.v_head_dim) * (lin.conv_width - 1)
    return len(lin.layers) * (recurrent + conv * dtype.itemsize)


def prefill_flops(cfg: ModelConfig, active_params: int, prompt_len: int) -> float:
    """2 * params * tokens for the matmuls + causal attention in the full-attention layers (QK^T
    and PV, half the square) + a hybrid's delta rule, counted as its recurrent form's work (per
    token and value head: S^T k, the rank-1 update and S^T q, 6 * Dk * Dv)."""
    lin = cfg.linear_attention
    attn_layers = cfg.num_hidden_layers - (len(lin.layers) if lin else 0)
    attn = 2 * 2 * attn_layers * cfg.num_attention_heads * cfg.head_dim * prompt_len**2 / 2
    delta = len(lin.layers) * lin.num_v_heads * 6 * lin.k_head_dim * lin.v_head_dim * prompt_len if lin else 0
    return 2 * active_params * prompt_len + attn + delta


def engine_model(engine) -> nn.Module:
    """The engine's model (its parameters' bytes and counts), or where it lives in worker
    processes the same model built on the meta device."""
    runner = getattr(engine.executor, "runner", None)
    if runner is not None:
        return runner.model
    from hotpath.layers.quant.base import building_with
    from hotpath.models.registry import get_model_class

    cfg, old = engine.model_config, torch.get_default_dtype()
    torch.set_default_dtype(engine.dtype)
    try:
        with torch.device("meta"), building_with(cfg.quantization):
            return get_model_class(cfg.architecture)(cfg, engine.config.max_model_len)
    finally:
        torch.set_default_dtype(old)
