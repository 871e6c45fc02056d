"""Every Triton kernel of hotpath, compiled ahead of time on a machine without a GPU for AMD MI300X
(hip/gfx942), AMD MI355X (hip/gfx950) and the NVIDIA H200 (cuda/90), at the launches the engine
makes on each.

What passing proves: at every configuration the engine's host code picks on that target for these
model shapes, each kernel compiles to the target's binary (an hsaco for hip, a cubin for cuda),
with the launch options and the argument specialisation (alignment, divisibility, AMD's buffer
loads for tensors under 2 GB) that a launch on that target would use. Nothing runs: no kernel is
executed on AMD here, so neither results nor speed on AMD are checked.

The launches come from the engine's own code rather than a table of numbers: a two-layer model of
each shape (bf16) is built on the meta device (no memory) and runs the steps the engine runs, with
every Triton kernel replaced by a recorder and the target's SM count and PDL choice in place of
the device's. A child process per target, where the kernels are compiled rather than interpreted
(tests/ops sets TRITON_INTERPRET=1), records them again and compiles each one with Triton's own
specialisation for the target (hotpath.ops.triton_utils.compile_launch).

    pytest tests/ops/test_cross_compile.py -v         # a case per (target, distinct binary)
    pytest tests/ops/test_cross_compile.py -k int4    # compiles the selected cases only

A case stands for every launch that compiles to its binary: launches are told apart by Triton's
compile key, not by their arguments' values (see record). The time is the ~205 distinct compiles
a target, about 4 CPU minutes each target, which is why the three children start as soon as the
session has collected its tests and compile beside the rest of the session: this file's tests run
last (tests/ops/conftest.py), so only what the children have left is waited for. Under pytest-xdist
(the default, pyproject.toml) they run first instead, on one worker, which starts the children and
waits on them while the other worker runs the rest of the session.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402

import hotpath.ops  # noqa: E402
from compile_children import CompileChildren  # noqa: E402
from hotpath.bench.presets import PRESETS  # noqa: E402
from hotpath.config import ModelConfig  # noqa: E402
from hotpath.models.registry import config_from_hf, get_model_class  # noqa: E402
from hotpath.ops import backend, triton_utils  # noqa: E402
from hotpath.ops.attention import (  # noqa: E402
    decode_splits,
    paged_attention,
    rope_and_paged_attention,
    write_kv_cache,
)
from hotpath.ops.bitmask import apply_token_bitmask  # noqa: E402
from hotpath.ops.gated_delta import decode_step, triton_chunked, triton_conv  # noqa: E402
from hotpath.ops.moe import add_into_residual  # noqa: E402
from hotpath.ops.norm import gated_rms_norm  # noqa: E402
from hotpath.ops.sampling import greedy_sample  # noqa: E402
from hotpath.runner.decode_inputs import DecodeInputs  # noqa: E402
from hotpath.layers.forward_batch import ForwardBatch  # noqa: E402
from hotpath.runner.graphs import SHORT_CONTEXT_GRAPHS  # noqa: E402


@dataclass(frozen=True)
class Target:
    name: str
    target: GPUTarget
    sm_count: int  # SMs (CUs on AMD): the host code sizes splits and tiles from it
    memory_gb: int  # sizes the KV cache, whose size decides AMD's buffer loads
    binary: str  # what the compile must produce


TARGETS = {t.name: t for t in (
    Target("gfx942", GPUTarget("hip", "gfx942", 64), 304, 192, "hsaco"),  # MI300X
    Target("gfx950", GPUTarget("hip", "gfx950", 64), 256, 288, "hsaco"),  # MI355X
    Target("sm90", GPUTarget("cuda", 90, 32), 132, 141, "cubin"),  # H200
)}


@dataclass(frozen=True)
class Run:
    name: str
    config: dict  # config.json
    memory_share: float  # of the GPU's memory for weights and KV cache (gpu_memory_utilization)
    kv_cache_dtype: str = "auto"  # "fp8": the target's fp8 (e4m3fnuz on gfx942), twice the blocks


# the default model's shapes (Qwen2.5-Coder-0.5B): q/k/v biases, no QK-norm, head_dim 64
QWEN25_05B = dict(architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=896,
                  intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
RUNS = (
    Run("qwen3-0.6b", PRESETS["qwen3-0.6b"], 0.9),
    Run("qwen3-8b", PRESETS["qwen3-8b"], 0.9),
    Run("qwen2.5-0.5b", QWEN25_05B, 0.9),
    # MoE: routing, the few-token expert kernels (decode batches 1-8) and the sorted grouped GEMM
    # (batch 64, the prefill)
    Run("qwen3-30b-a3b", PRESETS["qwen3-30b-a3b"], 0.9),
    # at the default share every layer's K and V caches are over 2 GB, so AMD reads them with
    # plain loads; a smaller share (or a larger model) takes them under 2 GB: buffer loads
    Run("qwen3-8b-mem0.3", PRESETS["qwen3-8b"], 0.3),
    # an fp8 KV cache: the attention, RoPE and cache-write kernels' fp8 variants (quantizing
    # writes, upcasting reads), with QK-norm and head_dim 128, and without at head_dim 64
    Run("qwen3-8b-fp8kv", PRESETS["qwen3-8b"], 0.9, "fp8"),
    Run("qwen2.5-0.5b-fp8kv", QWEN25_05B, 0.9, "fp8"),
)
# the decode graphs' batch sizes tried: one-row GEMVs, two-row FMA GEMVs, tensor-core GEMVs,
# cuBLAS projections with the attention alone filling the GPU
DECODE_BATCHES = (1, 2, 8, 64)
BLOCK_SIZE = 16  # the engine's default KV block size
META = torch.device("meta")


@dataclass
class Launch:
    kernel: str  # module:name of the @triton.jit function
    label: str  # run/step/kernel(the model parameter it reads, if any)
    args: tuple
    kwargs: dict


# ---- recording the launches -------------------------------------------------------------------

def _kernel_modules() -> list:
    """hotpath.ops's Triton modules (triton*.py), imported."""
    return [importlib.import_module(m.name)
            for m in pkgutil.walk_packages(hotpath.ops.__path__, "hotpath.ops.")
            if m.name.rsplit(".", 1)[-1].startswith("triton")]


def _jit_functions(module) -> dict[str, object]:
    """The @triton.jit functions `module` defines (compiled or interpreted)."""
    return {name: obj for name, obj in vars(module).items()
            if isinstance(obj, triton.runtime.jit.KernelInterface) and obj.fn.__module__ == module.__name__}


def all_kernels() -> set[str]:
    """Every kernel of hotpath.ops as module:name, by the convention that a kernel's name ends
    in _kernel (the @triton.jit helpers it calls do not)."""
    return {f"{m.__name__}:{name}" for m in _kernel_modules() for name in _jit_functions(m)
            if name.endswith("_kernel")}


class _Recorder:
    """Stands in for a @triton.jit function: fn[grid](*args, **kwargs) records the launch."""

    def __init__(self, kernel: str, launches: list[Launch], roles: dict[int, str], step: list[str]):
        self.kernel, self.launches, self.roles, self.step = kernel, launches, roles, step

    def __getitem__(self, grid) -> Callable[..., None]:
        return self._record

    def _record(self, *args, **kwargs) -> None:
        role = next((self.roles[id(a)] for a in args if id(a) in self.roles), None)
        label = f"{self.step[0]}/{self.kernel.split(':')[1]}" + (f"({role})" if role else "")
        self.launches.append(Launch(self.kernel, label, args, kwargs))


@contextlib.contextmanager
def _recording(target: Target, roles: dict[int, str], step: list[str]) -> Iterator[list[Launch]]:
    """Inside, every @triton.jit function of hotpath.ops records its launches instead of running
    (labelled with step[0] and the `roles` of the model parameters it reads), the ops take the
    Triton path on any tensor (meta ones too), and the host code sees `target`'s SM count and PDL
    choice."""
    launches: list[Launch] = []
    stand_ins = {"sm_count": lambda device: target.sm_count,
                 "pdl_enabled": lambda device: triton_utils.pdl_supported(target.target)}
    originals = {name: getattr(triton_utils, name) for name in stand_ins}
    saved: list[tuple[object, str, object]] = []
    for module in _kernel_modules():
        replaced = {name: value for name, value in stand_ins.items()
                    if getattr(module, name, None) is originals[name]}
        replaced |= {name: _Recorder(f"{module.__name__}:{name}", launches, roles, step)
                     for name in _jit_functions(module)}
        for name, value in replaced.items():
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    previous = backend.get_backend()
    backend.set_backend("triton")
    try:
        yield launches
    finally:
        backend.set_backend(previous)
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def _model(cfg: ModelConfig, max_positions: int) -> torch.nn.Module:
    """The model as loader.load_model builds it in bf16, on the meta device (no weights)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with META:
            return get_model_class(cfg.architecture)(cfg, max_positions).eval()
    finally:
        torch.set_default_dtype(default)


def _fp8(target: Target) -> torch.dtype:
    """The target's fp8 (ops.quant.fp8_dtype): e4m3fnuz on gfx942, e4m3fn elsewhere."""
    return torch.float8_e4m3fnuz if target.name == "gfx942" else torch.float8_e4m3fn


def _kv_cache(run: Run, model: torch.nn.Module, target: Target) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's K and V caches as the runner sizes them (its _num_kv_blocks, roughly): the
    memory share less the weights of the full model, over every layer's K and V."""
    cfg, layers = model.config, run.config["num_hidden_layers"]
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    weights = 2 * (sum(p.numel() for p in model.parameters()) + (layers - cfg.num_hidden_layers) * layer)
    dtype = _fp8(target) if run.kv_cache_dtype == "fp8" else torch.bfloat16
    per_block = dtype.itemsize * BLOCK_SIZE * cfg.num_key_value_heads * cfg.head_dim  # one of K or V
    blocks = int((run.memory_share * target.memory_gb * 1e9 - weights) // (2 * layers * per_block))
    shape = (blocks + 1, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)  # + the scratch block
    return (torch.empty(shape, dtype=dtype, device=META), torch.empty(shape, dtype=dtype, device=META))


def _ints(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(META)


def _batch(query_lens: list[int], context_lens: list[int], max_model_len: int) -> ForwardBatch:
    """A step outside the graphs (ModelRunner._prepare): sequences bringing query_lens tokens to
    context_lens."""
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    return ForwardBatch(
        cu_query_lens=_ints(cu, torch.int32), context_lens=_ints(context_lens, torch.int32),
        block_tables=torch.empty(len(query_lens), -(-max_model_len // BLOCK_SIZE), dtype=torch.int32,
                                 device=META),
        slot_mapping=torch.empty(cu[-1], dtype=torch.int64, device=META),
        logits_indices=_ints([c - 1 for c in cu[1:]], torch.int64),
        max_query_len=max(query_lens), max_context_len=max(context_lens))


def _steps(run: Run, model: torch.nn.Module, target: Target, step: list[str]) -> None:
    """The engine's steps for `run`'s model, each named in step[0] before it launches."""
    cfg, kv_heads = model.config, model.config.num_key_value_heads
    max_len = cfg.max_position_embeddings  # the engine's default max_model_len
    k_cache, v_cache = model.cache_layers()[0].caches()
    # the decode graphs (ModelRunner._capture_decode_graphs and row_graphs.graph_forward): model, LM head
    # and greedy sampling on views of the static input buffer, for contexts up to max_model_len
    # and, for batches where that at least halves the splits, up to a shorter one; the tokens go
    # to mapped host memory on CUDA only (runner/decode_inputs.DecodeInputs.mapped)
    inputs = DecodeInputs(max(DECODE_BATCHES), -(-max_len // BLOCK_SIZE), k_cache.shape[0] - 1,
                          BLOCK_SIZE, META)
    # (an fp8 cache's runs: batch 1 with splits and batch 64 without, full-length graphs; the
    # other batches and graphs are the same kernels at other tile sizes, left out for CI time)
    fp8 = run.kv_cache_dtype != "auto"
    for bs in (1, 64) if fp8 else DECODE_BATCHES:
        splits = decode_splits(bs, kv_heads, max_len, META)
        for ctx in [max_len] + [c for c in SHORT_CONTEXT_GRAPHS if not fp8 and c < max_len
                                and 2 * decode_splits(bs, kv_heads, c, META) <= splits]:
            step[0] = f"{run.name}/decode-b{bs}-ctx{ctx}"
            input_ids, positions, batch = inputs.views(bs, ctx)
            logits = model.compute_logits(model(input_ids, positions, batch))
            host_out = inputs.host_out(bs) if target.target.backend == "cuda" else None
            greedy_sample(logits, out=(inputs.token_ids[:bs], inputs.logprobs[:bs]), host_out=host_out)
    # steps outside the graphs (ModelRunner.launch): the model, then the LM head on the rows that
    # sample. A prefill of two sequences (one after a cached prefix); a chunk of 5 tokens after
    # 1000 cached (the decode attention kernel with several queries a sequence, which merges its
    # splits itself)
    for name, query_lens, context_lens in (("prefill", [1000, 512], [1000, 2048]),
                                           ("chunk5-after1000", [5], [1005])):
        step[0] = f"{run.name}/{name}"
        batch = _batch(query_lens, context_lens, max_len)
        tokens = torch.empty(sum(query_lens), dtype=torch.int64, device=META)
        model.compute_logits(model(tokens, tokens, batch)[batch.logits_indices])
    # what the engine does not launch but hotpath.ops offers: writing K/V into the cache (the
    # engine's RoPE kernels do it), and decode attention on rotated queries
    step[0] = f"{run.name}/ops"
    kv = torch.empty(512, 2, kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=META)
    write_kv_cache(kv[:, 0], kv[:, 1], k_cache, v_cache, torch.empty(512, dtype=torch.int64, device=META),
                   0.5, 0.5)
    q = torch.empty(1, cfg.num_attention_heads, cfg.head_dim, dtype=torch.bfloat16, device=META)
    batch = _batch([1], [1000], max_len)
    paged_attention(q, k_cache, v_cache, batch.cu_query_lens, batch.context_lens, batch.block_tables,
                    cfg.head_dim**-0.5, 1, max_len, 0.5, 0.5)
    # structured output's token bitmask over a step's logits, half of 64 rows constrained
    words = -(-cfg.vocab_size // 32)
    apply_token_bitmask(torch.empty(64, cfg.vocab_size, dtype=torch.float32, device=META),
                        torch.empty(32, words, dtype=torch.int32, device=META),
                        torch.empty(32, dtype=torch.int64, device=META))
    if run.kv_cache_dtype != "auto":
        return  # the rest has no KV cache: the other runs record it
    # the hybrid models' Gated DeltaNet decode step, at Qwen3-Next-80B's linear-attention shape
    # (16 key heads, 32 value heads of 128; their layers are not in these runs' models), 64 rows
    hk, hv, d, width, rows, slots = 16, 32, 128, 4, 64, 256
    conv_dim = 2 * hk * d + hv * d
    # (the conv's input a strided view of the projection, as Qwen3.5's layer passes it)
    proj = torch.empty(rows, conv_dim + hv * d + 2 * hv, dtype=torch.bfloat16, device=META)
    decode_step(proj[:, :conv_dim],
                torch.empty(conv_dim, width, dtype=torch.bfloat16, device=META),
                torch.empty(slots, conv_dim, width - 1, dtype=torch.bfloat16, device=META),
                *[torch.empty(rows, hv, dtype=torch.bfloat16, device=META)] * 2,
                *[torch.empty(hv, dtype=torch.bfloat16, device=META)] * 2,
                torch.empty(slots, hv, d, d, dtype=torch.float32, device=META),
                torch.empty(rows, dtype=torch.int64, device=META), _ints([5] * rows, torch.int32), hk)
    # the layer's gated output norm (its gate a view of the projection), and the end of the
    # shared-expert MoE block in the fused chain (the routed-only form runs in the MoE run)
    gated_rms_norm(torch.empty(rows, hv, d, dtype=torch.bfloat16, device=META),
                   proj[:, conv_dim : conv_dim + hv * d].view(rows, hv, d),
                   torch.empty(d, dtype=torch.bfloat16, device=META), 1e-6)
    hidden = torch.empty(rows, 2048, dtype=torch.bfloat16, device=META)
    add_into_residual(hidden, hidden, hidden, proj[:, -1:])
    # its prefill (the conv, then triton_chunked's rule, chunks of 64; called directly, as these
    # runs' models have no such layer) at the same shape: two sequences, 1512 tokens
    tokens, cu = 1512, _ints([0, 1000, 1512], torch.int32)
    chunks = (torch.empty(tokens // 64 + 2, dtype=torch.int32, device=META), _ints([0, 16, 24], torch.int32))
    triton_conv.causal_conv1d_varlen(
        torch.empty(tokens, conv_dim + 8, dtype=torch.bfloat16, device=META)[:, :conv_dim],
        torch.empty(conv_dim, width, dtype=torch.bfloat16, device=META),
        torch.empty(slots, conv_dim, width - 1, dtype=torch.bfloat16, device=META),
        cu, torch.empty(2, dtype=torch.int64, device=META), chunks)
    triton_chunked.gated_delta_rule(
        *[torch.empty(tokens, hk, d, dtype=torch.bfloat16, device=META)] * 2,
        torch.empty(tokens, hv, d, dtype=torch.bfloat16, device=META),
        torch.empty(tokens, hv, dtype=torch.float32, device=META),
        torch.empty(tokens, hv, dtype=torch.bfloat16, device=META), cu,
        torch.empty(slots, hv, d, d, dtype=torch.float32, device=META),
        torch.empty(2, dtype=torch.int64, device=META))


def _quant_steps(run: Run, target: Target, step: list[str]) -> None:
    """hotpath.ops.quant, once, at Qwen3-8B's gate_up / down shapes: the GEMVs' fused forms at the
    decode batches in each weight format, the fp8 GEMM at decode batches, the GEMMs and activation
    quantization at a prefill. The fp8 dtype is the target's (e4m3fnuz on gfx942)."""
    from hotpath.ops import quant
    from hotpath.ops.quant import triton_gemm

    if run.name != "qwen3-8b":
        return
    f8 = _fp8(target)

    def e(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device=META)

    H, I, block = 4096, 12288, (128, 128)
    fp8 = {"ptpc": (e(2 * I, dtype=torch.float32), e(H, dtype=torch.float32), None),
           "block": (e(2 * I // 128, H // 128, dtype=torch.float32),
                     e(H // 128, I // 128, dtype=torch.float32), block)}
    for rows in range(1, quant.FP8_GEMV_MAX_ROWS + 1):  # the fp8 GEMV's fused forms
        rms = (e(2, rows, dtype=torch.float32), e(H), 1e-6)
        for name, (s_up, s_down, bs) in fp8.items():
            step[0] = f"{run.name}/quant-{name}-b{rows}-gate_up"
            quant.fp8_linear_silu_and_mul(e(rows, H), e(2 * I, H, dtype=f8), s_up, bs, rms=rms)
            step[0] = f"{run.name}/quant-{name}-b{rows}-down"
            quant.fp8_linear_add_residual(e(rows, I), e(H, I, dtype=f8), s_down, bs, e(rows, H))
    for rows in (16, 32):  # decode batches' fp8 GEMM tiles, the down projection's split K
        for name, (s_up, s_down, bs) in fp8.items():
            step[0] = f"{run.name}/quant-{name}-b{rows}-gate_up"
            quant.fp8_linear(e(rows, H), e(2 * I, H, dtype=f8), s_up, bs)
            step[0] = f"{run.name}/quant-{name}-b{rows}-down"
            # the tiles and K split an H200's 132 SMs get (meta tensors count 4)
            config = triton_gemm.choose_config(rows, 128, target.target.backend == "hip", N=H, K=I)
            triton_gemm.fp8_linear(e(rows, I), e(H, I, dtype=f8), s_down, bs, config=config)
    for rows in DECODE_BATCHES[:3] + (16,):
        rms = (e(2, rows, dtype=torch.float32), e(H), 1e-6)
        for name, perm in (("awq", None), ("gptq-act-order", e(H, dtype=torch.int32))):
            step[0] = f"{run.name}/quant-{name}-b{rows}-gate_up"
            quant.int4_linear_silu_and_mul(e(rows, H), e(2 * I, H // 8, dtype=torch.int32),
                                           e(2 * I, H // 128), e(2 * I, H // 128, dtype=torch.uint8),
                                           128, perm, rms=rms)
            step[0] = f"{run.name}/quant-{name}-b{rows}-o_bias"
            quant.int4_linear(e(rows, H), e(H, H // 8, dtype=torch.int32), e(H, H // 128),
                              e(H, H // 128, dtype=torch.uint8), 128, perm, bias=e(H))
        step[0] = f"{run.name}/quant-awq-g32-b{rows}-down"
        quant.int4_linear_add_residual(e(rows, I), e(H, I // 8, dtype=torch.int32), e(H, I // 32),
                                       e(H, I // 32, dtype=torch.uint8), 32, None, e(rows, H))
    # a decode batch past 16 rows: the int4 GEMV with x padded to 32
    step[0] = f"{run.name}/quant-awq-b32-gate_up"
    quant.int4_linear_silu_and_mul(e(32, H), e(2 * I, H // 8, dtype=torch.int32), e(2 * I, H // 128),
                                   e(2 * I, H // 128, dtype=torch.uint8), 128, None,
                                   rms=(e(2, 32, dtype=torch.float32), e(H), 1e-6))
    for rows in (64, 1512):
        for name, (s_up, _, bs) in fp8.items():
            step[0] = f"{run.name}/quant-{name}-prefill{rows}"
            quant.fp8_linear(e(rows, H), e(2 * I, H, dtype=f8), s_up, bs)
        for name, perm in (("awq", None), ("gptq-act-order", e(H, dtype=torch.int32))):
            step[0] = f"{run.name}/quant-{name}-prefill{rows}"
            quant.int4_linear(e(rows, H), e(H, H // 8, dtype=torch.int32), e(H, H // 128),
                              e(H, H // 128, dtype=torch.uint8), 128, perm)
    if target.target.backend == "cuda":
        # the int4 kernels' PTX dequantization, which the host picks on NVIDIA GPUs only (not on
        # meta tensors), in bf16 and fp16
        from dataclasses import replace

        from hotpath.ops.quant import triton_int4

        for dtype in (torch.bfloat16, torch.float16):
            w = (e(2 * I, H // 8, dtype=torch.int32), e(2 * I, H // 128, dtype=dtype),
                 e(2 * I, H // 128, dtype=torch.uint8), 128)
            for rows in (1, 16):
                step[0] = f"{run.name}/quant-awq-ptx-{dtype}-b{rows}-gate_up"
                cfg = triton_int4.choose_gemv_config(rows, 2 * I, H, 16, META)
                triton_int4.int4_linear_silu_and_mul(e(rows, H, dtype=dtype), *w, None, rms=None,
                                                     config=replace(cfg, asm=True))
            step[0] = f"{run.name}/quant-awq-ptx-{dtype}-prefill1512"
            triton_int4.int4_gemm(e(1512, H, dtype=dtype), *w,
                                  config=replace(triton_int4.choose_gemm_config(1512, 16, META), asm=True))
    step[0] = f"{run.name}/quant-norm"
    quant.fused_add_rms_norm_fp8(e(1512, H), e(1512, H), e(H), 1e-6, f8)


def _gguf_steps(run: Run, target: Target, step: list[str]) -> None:
    """hotpath.ops.gguf, once, at Qwen2.5-0.5B's shapes in the types of the default model (its
    Q4_K_M GGUF: Q5_0 and Q8_0 projections, Q4_K / Q6_K down projections) and of the 1.5B one
    (Q4_K / Q6_K everywhere): the decode chain's forms at one and 16 rows, the plain kernel at a
    1512-token prefill. The other types share the code and run in the interpreter's tests."""
    from hotpath.ops import gguf as ops_gguf
    from hotpath.ops.gguf import empty_weight

    if run.name != "qwen2.5-0.5b":
        return
    H, I = 896, 4864  # Qwen2.5-0.5B's hidden and intermediate sizes
    K_H = 1024  # a K-quant's in_features must hold whole 256-column superblocks (1.5B: 1536)

    def e(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device=META)

    for rows in (1, 16):
        rms = (e(2, rows, dtype=torch.float32), e(H), 1e-6)
        step[0] = f"{run.name}/gguf-q5_0-b{rows}-qkv"
        ops_gguf.gguf_linear(e(rows, H), empty_weight("Q5_0", 1152, H, META), bias=e(1152), rms=rms)
        step[0] = f"{run.name}/gguf-q8_0-b{rows}-v"
        ops_gguf.gguf_linear(e(rows, H), empty_weight("Q8_0", 128, H, META), bias=e(128))
        step[0] = f"{run.name}/gguf-q5_0-b{rows}-gate_up"
        ops_gguf.gguf_linear_silu_and_mul(e(rows, H), empty_weight("Q5_0", 2 * I, H, META), rms=rms)
        for name in ("Q4_K", "Q6_K"):
            step[0] = f"{run.name}/gguf-{name.lower()}-b{rows}-down"
            ops_gguf.gguf_linear_add_residual(e(rows, I), empty_weight(name, H, I, META), e(rows, H))
            step[0] = f"{run.name}/gguf-{name.lower()}-b{rows}-gate_up"
            ops_gguf.gguf_linear_silu_and_mul(e(rows, K_H), empty_weight(name, 2 * I, K_H, META))
    for name in ("Q5_0", "Q8_0", "Q4_K", "Q6_K"):
        step[0] = f"{run.name}/gguf-{name.lower()}-prefill1512"
        ops_gguf.gguf_linear(e(1512, I), empty_weight(name, H, I, META))


def _moe_fp8_steps(run: Run, target: Target, step: list[str], roles: dict[int, str]) -> None:
    """The fused MoE kernels on fp8 experts (FusedExperts under an fp8 format), once, at
    Qwen3-30B-A3B's shapes in the target's fp8: block scales as Qwen3-30B-A3B-FP8 ships them and
    per channel (compressed-tensors, online fp8), decode at one token (FMA sums per segment) and 8
    (tensor cores), the grouped GEMM at 64 and at a 1512-token prefill."""
    from hotpath.ops.moe import fused_moe

    if run.name != "qwen3-30b-a3b":
        return
    f8 = _fp8(target)
    E, H, I, top_k = 128, 2048, 768, 8

    def e(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=META)

    scales = {"block": (e(E, 2 * I // 128, H // 128), e(E, H // 128, I // 128), (128, 128)),
              "channel": (e(E, 2 * I), e(E, H), None)}
    w13, w2 = e(E, 2 * I, H, dtype=f8), e(E, H, I, dtype=f8)
    roles[id(w13)], roles[id(w2)] = "experts.w13", "experts.w2"  # the grouped GEMM's two launches
    for T in (1, 8, 64, 1512):
        for name, (s13, s2, block) in scales.items():
            step[0] = f"{run.name}/moe-fp8-{name}-b{T}"
            fused_moe(e(T, H, dtype=torch.bfloat16), w13, w2, e(T, top_k), e(T, top_k, dtype=torch.int32),
                      s13, s2, block)


def _moe_int4_steps(run: Run, target: Target, step: list[str], roles: dict[int, str]) -> None:
    """The fused MoE kernels on int4 experts (FusedExperts under AWQ / GPTQ), once, at
    Qwen3-30B-A3B's shapes (Qwen3-30B-A3B-AWQ / -GPTQ-Int4: groups of 128, fp16; and bf16
    scales and x): decode at one token (element-wise sums per run) and 8 (tensor cores), the
    grouped GEMM at 64 and at a 1512-token prefill."""
    from hotpath.ops.moe import fused_moe

    if run.name != "qwen3-30b-a3b":
        return
    E, H, I, top_k, G = 128, 2048, 768, 8, 128

    def e(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=META)

    w13, w2 = e(E, 2 * I, H // 8, dtype=torch.int32), e(E, H, I // 8, dtype=torch.int32)
    roles[id(w13)], roles[id(w2)] = "experts.w13", "experts.w2"  # the grouped GEMM's two launches
    zeros = dict(w13_zeros=e(E, 2 * I, H // G, dtype=torch.uint8), w2_zeros=e(E, H, I // G, dtype=torch.uint8))
    for dtype in (torch.float16, torch.bfloat16):
        for T in (1, 8, 64, 1512):
            step[0] = f"{run.name}/moe-int4-{str(dtype).removeprefix('torch.')}-b{T}"
            fused_moe(e(T, H, dtype=dtype), w13, w2, e(T, top_k), e(T, top_k, dtype=torch.int32),
                      e(E, 2 * I, H // G, dtype=dtype), e(E, H, I // G, dtype=dtype), group_size=G, **zeros)


def _allreduce_steps(run: Run, target: Target, step: list[str]) -> None:
    """The one-shot all-reduce + residual add + RMSNorm kernel (hotpath/ops/allreduce), once, at
    Qwen3-8B's hidden size over 2 and 8 ranks (the barriers' loops unroll per rank): one token and
    64, with the normed output in the target's fp8, and the plain all-reduce. The peer pointers
    are meta tensors: only the compile is checked."""
    from hotpath.ops.allreduce import PeerBuffers
    from hotpath.ops.allreduce import triton as one_shot

    if run.name != "qwen3-8b":
        return
    H = 4096

    def e(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device=META)

    for world in (2, 8):
        peers = PeerBuffers(0, world, e(world, dtype=torch.int64), e(world, dtype=torch.int64), 1 << 20)
        for T in (1, 64):
            step[0] = f"{run.name}/allreduce-tp{world}-b{T}"
            one_shot.all_reduce_add_rms_norm(e(T, H), e(T, H), e(H), 1e-6, peers)
        step[0] = f"{run.name}/allreduce-fp8-tp{world}"
        one_shot.all_reduce_add_rms_norm_fp8(e(8, H), e(8, H), e(H), 1e-6, peers, _fp8(target))
        step[0] = f"{run.name}/allreduce-sum-tp{world}"
        one_shot.all_reduce(e(8, H), peers)



def _mrope_decode_steps(run: Run, model: torch.nn.Module, step: list[str]) -> None:
    """Image-text models' decode: the fused decode kernel rotating at the positions it is given
    (mRoPE), at batch 1 (with splits) and 64, on the qwen3-8b run's layer (Qwen3-VL-8B's)."""
    if run.name != "qwen3-8b":
        return
    cfg = model.config
    attn = model.model.layers[0].self_attn
    k_cache, v_cache = attn.attn.caches()
    for bs in (1, 64):
        step[0] = f"{run.name}/mrope-decode-b{bs}"
        batch = _batch([1] * bs, [1000] * bs, cfg.max_position_embeddings)
        q = torch.empty(bs, cfg.num_attention_heads, cfg.head_dim, dtype=torch.bfloat16, device=META)
        kv = torch.empty(bs, cfg.num_key_value_heads, cfg.head_dim, dtype=torch.bfloat16, device=META)
        rope_and_paged_attention(q, kv, kv, batch.slot_mapping, attn.rotary.cos_sin_cache, k_cache, v_cache,
                                 batch.slot_mapping, attn.q_norm.weight, attn.k_norm.weight, 1e-6,
                                 batch.cu_query_lens, batch.context_lens, batch.block_tables,
                                 cfg.head_dim**-0.5, 1, batch.max_context_len, positions_apart=True)


def _vision_steps(run: Run, target: Target, step: list[str]) -> None:
    """The vision tower (hotpath/models/vision.py), one block of it in bf16, once, at
    Qwen3-VL-8B's widths (head_dim 72: the attention kernel's two dots) and Qwen3-VL-4B's
    (head_dim 64): an image of 64 x 64 patches (long segments' tiles), a video of 24 x 24 frames
    (short segments')."""
    from hotpath.models.vision import VisionConfig, VisionTower

    if run.name != "qwen3-8b":
        return
    for name, hidden in (("qwen3-vl-8b", 1152), ("qwen3-vl-4b", 1024)):
        cfg = VisionConfig(depth=1, hidden_size=hidden, deepstack_visual_indexes=(0,))
        with META:
            tower = VisionTower(cfg).to(torch.bfloat16)
        for grid in ((1, 64, 64), (4, 24, 24)):
            step[0] = f"{run.name}/vision-{name}-{'x'.join(map(str, grid))}"
            tower(torch.empty(grid[0] * grid[1] * grid[2], cfg.patch_dim, dtype=torch.bfloat16, device=META), [grid])


@functools.cache
def _binder(kernel: str, target: Target):
    """Triton's argument binder of `kernel` (module:name) for `target`: what JITFunction.run calls
    before its cache lookup. Built from the kernel's source and its @triton.jit arguments, so that
    it is the same whether the module's kernels are compiled or interpreted (this session)."""
    from triton.compiler import make_backend
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, create_function_from_signature

    module, name = kernel.split(":")
    fn = getattr(importlib.import_module(module), name)
    if isinstance(fn, InterpretedFunction):
        fn = JITFunction(fn.fn, **fn.kwargs)
    return create_function_from_signature(fn.signature, fn.params, make_backend(target.target))


def _compile_key(launch: Launch, target: Target) -> tuple:
    """What Triton compiles `launch` by on `target` (JITFunction.run's cache key, and the content
    of triton.compile's): the kernel, each argument's specialisation (constexpr values; a tensor's
    dtype, 16-byte alignment and, on AMD, whether it is under 2 GB for buffer loads; an integer's
    type, whether it is 1 and whether 16 divides it; floats by type only) and the launch options
    (num_warps, num_stages, ...). Two launches with one key compile to one binary: Triton's cache
    in the compiling process already gave the second the first one's binary for free."""
    _, specialization, options = _binder(launch.kernel, target)(*launch.args, **launch.kwargs)
    return launch.kernel, str(specialization), str(sorted(options.items()))


@functools.cache
def recorded(target: Target) -> list[Launch]:
    """Every kernel launch of every run's steps on `target`, in order."""
    launches: list[Launch] = []
    for run in RUNS:
        # two layers: the first normalises its input from the embedding's statistic, the
        # second from the first one's down_proj (a launch of its own)
        cfg = config_from_hf(dict(run.config, num_hidden_layers=2))
        model = _model(cfg, cfg.max_position_embeddings)
        caches = _kv_cache(run, model, target)
        for attn in model.cache_layers():
            attn.kv_cache = caches
        roles: dict[int, str] = {}  # parameter -> its name ("=" joins tied ones)
        for name, p in model.named_parameters(remove_duplicate=False):
            role = name.removeprefix("model.").removesuffix(".weight")
            roles[id(p)] = f"{roles[id(p)]}={role}" if id(p) in roles else role
        step = [""]
        with torch.inference_mode(), _recording(target, roles, step) as launched:
            _steps(run, model, target, step)
            _quant_steps(run, target, step)
            _gguf_steps(run, target, step)
            _moe_fp8_steps(run, target, step, roles)
            _moe_int4_steps(run, target, step, roles)
            _allreduce_steps(run, target, step)
            _vision_steps(run, target, step)
            _mrope_decode_steps(run, model, step)
        launches += launched
    return launches


def record(target: Target) -> list[Launch]:
    """The launches of recorded(target) that compile to distinct binaries: the first launch of each
    compile key (_compile_key), a case each (~205 a target). Distinct launches by argument values
    (this file's earlier rule) were ~275 a target; the ~70 more differed only in runtime values
    that no kernel specialises on beyond 1 / divisible by 16 (the int4 GEMV at 1, 2, 8 and 16
    rows, whose row count is not specialised; a decode graph's batch or context where the tiles
    stay; another model's widths where 16 divides both), so each compiled the very binary of an
    earlier case, from Triton's cache in the compiling process: collapsing them saves cases, not
    compile time. `also(target)[label]`: the launches a case stands for."""
    return _distinct(target)[0]


def also(target: Target) -> dict[str, list[str]]:
    return _distinct(target)[1]


@functools.cache
def _distinct(target: Target) -> tuple[list[Launch], dict[str, list[str]]]:
    firsts: dict[tuple, Launch] = {}
    same: dict[str, list[str]] = {}
    for launch in recorded(target):
        first = firsts.setdefault(_compile_key(launch, target), launch)
        if first is not launch:
            same.setdefault(first.label, []).append(launch.label)
    launches = list(firsts.values())
    labels = [launch.label for launch in launches]
    assert len(set(labels)) == len(labels), "two distinct launches share a label"
    return launches, same


# ---- compiling them ----------------------------------------------------------------------------

def compile_all(target: Target, labels: set[str] | None = None) -> dict[str, dict]:
    """label -> {"binary": kind, "bytes": size} or {"error": message}, for each launch of
    record(target) (those of `labels`, if given) compiled for it. The kernels must be compiled,
    not interpreted, here."""
    results = {}
    for launch in record(target):
        if labels is not None and launch.label not in labels:
            continue
        module, name = launch.kernel.split(":")
        fn = getattr(importlib.import_module(module), name)
        try:
            asm = triton_utils.compile_launch(fn, launch.args, launch.kwargs, target.target).asm
            kind = next(k for k in ("hsaco", "cubin") if k in asm)
            results[launch.label] = {"binary": kind, "bytes": len(asm[kind])}
        except Exception as e:  # reported by the launch's test case
            root = e
            while root.__cause__ is not None:  # a compile error's message is in its cause
                root = root.__cause__
            results[launch.label] = {"error": f"{type(e).__name__}: {str(e)[-2000:]}\n"
                                              f"caused by {type(root).__name__}: {str(root)[-1000:]}"}
    return results


def pytest_generate_tests(metafunc):
    if "label" in metafunc.fixturenames:
        cases = [(t, launch.label) for t in TARGETS for launch in record(TARGETS[t])]
        metafunc.parametrize("target,label", cases, ids=[f"{t}:{label}" for t, label in cases])


_children = CompileChildren("hotpath-cross-compile-")  # a child a target, compiling its cases


def start_compiling(items: list[pytest.Item]) -> None:
    """Starts a child per target compiling the cases among `items` (all of them, unless -k or node
    ids pick some), at low priority. Called when collection ends (tests/ops/conftest.py), so that
    their ~10 CPU minutes run beside every other test of the session (this file's run last), not
    ahead of its first case."""
    if _children.started:
        return
    selected: dict[str, list[str]] = {t: [] for t in TARGETS}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is sys.modules[__name__] and "label" in params:
            selected[params["target"]].append(params["label"])
    _children.start({t: ([__file__, t, "-"], json.dumps(labels)) for t, labels in selected.items() if labels})


stop_compiling = _children.stop


@pytest.fixture(scope="module")
def compiled(request) -> dict[str, dict[str, dict]]:
    """target -> compile_all(target) for the cases this session runs, from the children
    start_compiling started (now, if collection did not)."""
    start_compiling(request.session.items)
    return _children.results(timeout=3600)  # under pytest-xdist its worker waits from the start (~20 min on 2 cores)


def test_compiles(compiled, target, label):
    result = compiled[target][label]
    same = also(TARGETS[target]).get(label)
    assert "error" not in result, result["error"] + (f"\n(also the binary of {same})" if same else "")
    assert result["binary"] == TARGETS[target].binary and result["bytes"] > 0, result


def test_every_kernel_is_compiled():
    """A kernel no step launches (a new one, or one the engine stopped launching) fails here
    rather than going uncompiled unnoticed."""
    kernels = {launch.kernel for target in TARGETS.values() for launch in record(target)}
    assert all_kernels() <= kernels, sorted(all_kernels() - kernels)


def test_pdl_follows_the_target():
    """PDL (PTX) on the H200, as before; on AMD the kernels' fallback, USE_PDL off, and no
    launch_pdl option (AMD's Triton rejects the keyword, even set to False)."""
    for target in TARGETS.values():
        pdl = target.target.backend == "cuda"
        for launch in recorded(target):
            assert launch.kwargs.get("USE_PDL", pdl) == pdl, launch.label
            assert pdl or "launch_pdl" not in launch.kwargs, launch.label


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") != "1", "the kernels must be compiled, not interpreted"
    # python tests/ops/test_cross_compile.py TARGET [-]: every case, or those named on stdin (-)
    labels = set(json.load(sys.stdin)) if sys.argv[2:] == ["-"] else None
    os.nice(10)  # beside the rest of the test session: its tests come first
    print(json.dumps(compile_all(TARGETS[sys.argv[1]], labels)))
