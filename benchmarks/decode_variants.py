"""Variants of the decode step (batch 1, or --batch-size B), timed inside the real decode graph:
the same engine's graph captured again with decode attention swapped (none at all; a kernel that
only waits and copies its input; the real kernel with other launch parameters) or with other
GEMV tile configs for given weight shapes, every graph replayed in turn in one process, so the
step times compare within one run (between runs the same code varies by 2-4%). What a kernel
costs in the chain of a step (its wait, its tail, its neighbours' overlap) is not what it costs
back to back with itself, which is what the kernel benchmarks time.

    python benchmarks/decode_variants.py --preset qwen3-0.6b --variants full,none,copy --out DIR

"none" and "copy" compute wrong outputs; only their times mean anything.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl

import hotpath.layers.attention as layer_attention
import hotpath.ops.linear as linear_ops
from hotpath.ops.attention import triton_decode
from hotpath.ops.linear import triton_gemv
from hotpath.ops.rotary import qk_norm_rope_and_cache
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch_dependents, pdl_wait
from profile_decode import decoding_engine  # benchmarks/ is on the path when run as a script


@triton.jit
def _copy_kernel(q_ptr, out_ptr, stride_qt, stride_qh, ROWS: tl.constexpr, D: tl.constexpr,
                 USE_PDL: tl.constexpr):
    pdl_launch_dependents(USE_PDL)
    pdl_wait(USE_PDL)
    t = tl.program_id(0)
    r = tl.arange(0, ROWS)[:, None]
    d = tl.arange(0, D)[None, :]
    h = tl.program_id(1) * ROWS + r
    x = tl.load(q_ptr + t * stride_qt + h * stride_qh + d)
    tl.store(out_ptr + (t * tl.num_programs(1) * ROWS + h) * D + d, x)


def _copy(q, *args):
    """A kernel slot doing the least: wait for the projection, copy q (one program a kv head)."""
    t, h, d = q.shape
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    rows = h // 8 if h % 8 == 0 else h
    use_pdl = pdl_enabled(q.device)
    _copy_kernel[(t, h // rows)](q, out, q.stride(0), q.stride(1), ROWS=rows, D=d, USE_PDL=use_pdl,
                                 num_warps=4, launch_pdl=use_pdl)
    return out


def _fused(**launch):
    """The fused decode kernel with other launch parameters."""
    def attend(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, q_norm_w, k_norm_w,
               eps, cu_query_lens, context_lens, block_tables, scale, max_query_len, max_context_len):
        return triton_decode.paged_attention(
            q, k_cache, v_cache, cu_query_lens, context_lens, block_tables, scale, max_query_len,
            max_context_len, rope=(k, v, cos_sin, q_norm_w, k_norm_w, eps), **launch)
    return attend


def _unfused(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, q_norm_w, k_norm_w, eps,
             cu_query_lens, context_lens, block_tables, scale, max_query_len, max_context_len):
    """The two-kernel path: QK-norm, RoPE and the cache write, then attention."""
    q = qk_norm_rope_and_cache(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                               q_norm_w, k_norm_w, eps)
    return triton_decode.paged_attention(q, k_cache, v_cache, cu_query_lens, context_lens,
                                         block_tables, scale, max_query_len, max_context_len)


def _gemv(**shapes):
    """GEMV configs on the one-row (FMA) path (M = 1, or 2 on small weights) by weight shape: r{rows}x{K}=(block_n, block_k, split_k, warps[,
    tail_k])."""
    return {tuple(int(v) for v in name[1:].split("x")): triton_gemv.GemvConfig(*c[:3], c[3], 1, False, *c[4:])
            for name, c in shapes.items()}


ATTENTION = {
    "none": lambda q, *args: q,
    "copy": _copy,
    "unfused": _unfused,
    "direct": _fused(num_splits=1),
    "splits4": _fused(num_splits=4),
    "splits26_bn32": _fused(num_splits=26, block_n=32),
    "stages1": _fused(num_stages=1),
    "stages3": _fused(num_stages=3),
    "warps2": _fused(num_warps=2),
    "warps8": _fused(num_warps=8),
    "d128w8": _fused(num_splits=1, block_n=128, num_warps=8),
    "s3_256w8s1": _fused(num_splits=3, block_n=256, num_warps=8, num_stages=1),
    "s5_128w4": _fused(num_splits=5, block_n=128, num_warps=4),
    # the split count at the same context: the bench's graph (max_model_len 784) takes 13, this
    # script's 16, a server's with max_model_len 40960 66; 9 hold context at 532 tokens
    "splits9": _fused(num_splits=9, block_n=64),
    "splits13": _fused(num_splits=13, block_n=64),
    "splits24": _fused(num_splits=24, block_n=64),
    "splits32": _fused(num_splits=32, block_n=64),
    "splits48": _fused(num_splits=48, block_n=64),
    # 32-key splits: 17 of them hold the context
    "splits17_bn32": _fused(num_splits=17, block_n=32),
    "splits32_bn32": _fused(num_splits=32, block_n=32),
    # shared memory a split program takes (Triton 3.6): 38 KB as it is, 21.5 KB in 32-key tiles,
    # 22.5 KB in one stage, 13 KB both: under the batch-1 graph's 10% carveout (run L) the last
    # ones may fit the split every other kernel of the step asks for
    "splits17_bn32_s1": _fused(num_splits=17, block_n=32, num_stages=1),
    "splits66": _fused(num_splits=66, block_n=64),
}
# The GEMV variants of run F (docs/benchmarks.md), each against the rule of its call
GEMV = {
    # Qwen3-0.6B: qkv 4096x1024, o 1024x2048, gate_up 6144x1024, down 1024x3072
    "06_down_nosplit": _gemv(r1024x3072=(8, 4096, 1, 8)),
    "06_down_k1024s3": _gemv(r1024x3072=(8, 1024, 3, 4)),
    "06_down_k1024s1": _gemv(r1024x3072=(8, 1024, 1, 4)),
    "06_down_n4": _gemv(r1024x3072=(4, 2048, 2, 8)),
    "06_o_k1024s2": _gemv(r1024x2048=(8, 1024, 2, 4)),
    "06_o_n4": _gemv(r1024x2048=(4, 2048, 1, 8)),
    "06_o_n4k1024": _gemv(r1024x2048=(4, 1024, 1, 4)),
    "06_qkv_n4": _gemv(r4096x1024=(4, 1024, 1, 4)),
    "06_qkv_n16w8": _gemv(r4096x1024=(16, 1024, 1, 8)),
    "06_qkv_k512s2": _gemv(r4096x1024=(8, 512, 2, 4)),
    "06_gu_n4": _gemv(r6144x1024=(4, 1024, 1, 4)),
    "06_gu_n16w8": _gemv(r6144x1024=(16, 1024, 1, 8)),
    # Qwen3-8B: qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288
    "8_o_nosplit": _gemv(r4096x4096=(8, 2048, 1, 8)),
    "8_o_k1024s1": _gemv(r4096x4096=(8, 1024, 1, 4)),
    "8_o_k2048s2": _gemv(r4096x4096=(8, 2048, 2, 8)),
    "8_down_nosplit": _gemv(r4096x12288=(8, 2048, 1, 8)),
    "8_down_k2048s2": _gemv(r4096x12288=(8, 2048, 2, 8)),
    "8_down_k1024s3": _gemv(r4096x12288=(8, 1024, 3, 4)),
    "8_down_k1024s1": _gemv(r4096x12288=(8, 1024, 1, 4)),
    "8_qkv_k1024": _gemv(r6144x4096=(8, 1024, 1, 4)),
    "8_qkv_n16w8": _gemv(r6144x4096=(16, 1024, 1, 8)),
    "8_qkv_k4096": _gemv(r6144x4096=(8, 4096, 1, 8)),
    "8_gu_k1024": _gemv(r24576x4096=(8, 1024, 1, 4)),
    "8_gu_n16": _gemv(r24576x4096=(16, 2048, 1, 8)),
    # whole-K tiles (the program's weight all loaded before PDL's wait), and combinations
    "06_A": _gemv(r1024x3072=(8, 4096, 1, 8)),
    "06_A_qkv_n4": _gemv(r1024x3072=(8, 4096, 1, 8), r4096x1024=(4, 1024, 1, 4)),
    "06_A_qkv_n4_o_n4": _gemv(r1024x3072=(8, 4096, 1, 8), r4096x1024=(4, 1024, 1, 4), r1024x2048=(4, 2048, 1, 8)),
    "06_A_down_w16": _gemv(r1024x3072=(8, 4096, 1, 16)),
    "06_A_gu_w8": _gemv(r1024x3072=(8, 4096, 1, 8), r6144x1024=(8, 1024, 1, 8)),
    "06_A_qkv_w8": _gemv(r1024x3072=(8, 4096, 1, 8), r4096x1024=(8, 1024, 1, 8)),
    "8_B": _gemv(r6144x4096=(8, 4096, 1, 8)),
    "8_B_qkv_w16": _gemv(r6144x4096=(8, 4096, 1, 16)),
    "8_B_gu": _gemv(r6144x4096=(8, 4096, 1, 8), r24576x4096=(8, 4096, 1, 8)),
    "8_B_gu_o": _gemv(r6144x4096=(8, 4096, 1, 8), r24576x4096=(8, 4096, 1, 8), r4096x4096=(8, 4096, 1, 8)),
    "8_B_gu_o1024": _gemv(r6144x4096=(8, 4096, 1, 8), r24576x4096=(8, 4096, 1, 8), r4096x4096=(8, 1024, 1, 4)),
    "8_B_o": _gemv(r6144x4096=(8, 4096, 1, 8), r4096x4096=(8, 4096, 1, 8)),
    "8_B_lm": _gemv(r6144x4096=(8, 4096, 1, 8), r151936x4096=(8, 4096, 1, 8)),
    # Qwen3-32B (qkv 10240x5120, o 5120x8192, gate_up 51200x5120, down 5120x25600, LM head
    # 151936x5120) and Qwen2.5-Coder-32B (qkv 7168x5120, o 5120x5120, gate_up 55296x5120):
    # K = 5120 in two tiles, 4096 + 1024, both loaded before PDL's wait
    "32_tail": _gemv(r10240x5120=(8, 4096, 1, 8, 1024), r51200x5120=(8, 4096, 1, 8, 1024)),
    "32_tail_qkv": _gemv(r10240x5120=(8, 4096, 1, 8, 1024)),
    "32_tail_lm": _gemv(r10240x5120=(8, 4096, 1, 8, 1024), r51200x5120=(8, 4096, 1, 8, 1024),
                        r151936x5120=(8, 4096, 1, 8, 1024)),
    "32_o16": _gemv(r5120x8192=(8, 8192, 1, 16)),
    "32_tail_o16": _gemv(r10240x5120=(8, 4096, 1, 8, 1024), r51200x5120=(8, 4096, 1, 8, 1024),
                         r5120x8192=(8, 8192, 1, 16)),
    # Qwen3-0.6B down_proj (K = 3072): one 4096-wide tile, a quarter masked (the rule before run
    # H), against the two tiles 2048 + 1024 of the rule since
    "06_down_pad": _gemv(r1024x3072=(8, 4096, 1, 8)),
    "c32_tail": _gemv(r7168x5120=(8, 4096, 1, 8, 1024), r55296x5120=(8, 4096, 1, 8, 1024),
                      r5120x5120=(8, 4096, 1, 8, 1024)),
    # choose_config before run F's whole-K rule, and whole-K tiles of 4 rows
    "06_old_rule": _gemv(r4096x1024=(8, 1024, 1, 4), r1024x2048=(8, 2048, 1, 8),
                         r6144x1024=(8, 1024, 1, 4), r1024x3072=(8, 2048, 2, 8)),
    "8_old_rule": _gemv(r6144x4096=(8, 2048, 1, 8), r4096x4096=(8, 1024, 2, 4),
                        r24576x4096=(8, 2048, 1, 8), r4096x12288=(8, 1024, 2, 4),
                        r151936x4096=(8, 2048, 1, 8)),
    # Qwen3-0.6B's batch 2 in 8-row tiles, as at one row (4 since run K)
    "06_n8": _gemv(r4096x1024=(8, 1024, 1, 8), r1024x2048=(8, 2048, 1, 8),
                   r6144x1024=(8, 1024, 1, 4), r1024x3072=(8, 4096, 1, 8)),
    "06_n4": _gemv(r4096x1024=(4, 1024, 1, 4), r1024x2048=(4, 2048, 1, 8),
                   r6144x1024=(4, 1024, 1, 4), r1024x3072=(4, 4096, 1, 8)),
    "8_n4": _gemv(r6144x4096=(4, 4096, 1, 8), r4096x4096=(4, 4096, 1, 8),
                  r24576x4096=(4, 4096, 1, 8), r151936x4096=(4, 4096, 1, 8)),
    "8_n4_qkv_o": _gemv(r6144x4096=(4, 4096, 1, 8), r4096x4096=(4, 4096, 1, 8)),
    # down_proj at 8B (K = 12288 > MAX_BLOCK_K): 4096-wide tiles, K split in 3 or not
    "8_down_k4096s3": _gemv(r4096x12288=(8, 4096, 3, 8)),
    "8_down_n4k4096s3": _gemv(r4096x12288=(4, 4096, 3, 8)),
    "8_down_k4096s1": _gemv(r4096x12288=(8, 4096, 1, 8)),
    # 8B down_proj whole, as 8192 + 4096 (8 rows over 16 warps, or 4 rows)
    "8_down_two16": _gemv(r4096x12288=(8, 8192, 1, 16, 4096)),
    "8_down_two_n4": _gemv(r4096x12288=(4, 8192, 1, 8, 4096)),
    "8_down_two_n4w16": _gemv(r4096x12288=(4, 8192, 1, 16, 4096)),
    # 8B o_proj in smaller programs (registers a thread, Triton 3.6: 8 x 4096 over 8 warps 122;
    # 4 rows over 4 warps 100; 2 rows over 2 warps 96, over 4 64): more of them fit on an SM
    # beside attention's and the merge's programs, so more of the weight loads during attention
    "8_o_n4w4": _gemv(r4096x4096=(4, 4096, 1, 4)),
    "8_o_n2w2": _gemv(r4096x4096=(2, 4096, 1, 2)),
    "8_o_n2w4": _gemv(r4096x4096=(2, 4096, 1, 4)),
    # Qwen3-0.6B's o_proj and down_proj again, with the merge kernel before o_proj (run J)
    "06_o_w4": _gemv(r1024x2048=(8, 2048, 1, 4)),
    "06_o_n4w4": _gemv(r1024x2048=(4, 2048, 1, 4)),
    "06_o_n16": _gemv(r1024x2048=(16, 2048, 1, 8)),
    "06_down_n4whole": _gemv(r1024x3072=(4, 4096, 1, 8)),
    # fewer, taller programs (run M): Qwen3-0.6B's o_proj and down_proj, and the same idea at 8B
    "06_o_n8": _gemv(r1024x2048=(8, 2048, 1, 8)),  # the rule before run M
    "06_o_n16w16": _gemv(r1024x2048=(16, 2048, 1, 16)),
    "06_o_n16w4": _gemv(r1024x2048=(16, 2048, 1, 4)),
    "06_o_n32w16": _gemv(r1024x2048=(32, 2048, 1, 16)),
    "06_down_n2": _gemv(r1024x3072=(2, 4096, 1, 8)),
    "06_down_n16w16": _gemv(r1024x3072=(16, 4096, 1, 16)),
    "06_o16_d4": _gemv(r1024x2048=(16, 2048, 1, 8), r1024x3072=(4, 4096, 1, 8)),
    "06_o16_d4_q16": _gemv(r1024x2048=(16, 2048, 1, 8), r1024x3072=(4, 4096, 1, 8),
                           r4096x1024=(16, 1024, 1, 8)),
    "06_o16_d4_gw8": _gemv(r1024x2048=(16, 2048, 1, 8), r1024x3072=(4, 4096, 1, 8),
                           r6144x1024=(8, 1024, 1, 8)),
    "8_o_n16w16": _gemv(r4096x4096=(16, 4096, 1, 16)),
    "8_o_n16": _gemv(r4096x4096=(16, 4096, 1, 8)),
    "8_down_n4": _gemv(r4096x12288=(4, 4096, 1, 8)),
    "8_qkv_n16w16": _gemv(r6144x4096=(16, 4096, 1, 16)),
    "8_gu_n16w16": _gemv(r24576x4096=(16, 4096, 1, 16)),
    # Qwen3-32B's o_proj (K = 8192) walking two 4096-wide tiles unsplit, as 8_down_k4096s1 does
    # 8B's down_proj (K = 12288) in three
    "32_o_k4096s1": _gemv(r5120x8192=(8, 4096, 1, 8)),
    # Qwen3-32B (qkv 10240x5120, o 5120x8192, gate_up 51200x5120, down 5120x25600) under run E's
    # rule: 2048-wide tiles over 8 warps, no split
    "32_old_rule": _gemv(r10240x5120=(8, 2048, 1, 8), r5120x8192=(8, 2048, 1, 8),
                         r51200x5120=(8, 2048, 1, 8), r5120x25600=(8, 2048, 1, 8),
                         r151936x5120=(8, 2048, 1, 8)),
}


# The graph as it is, captured again (each capture in a memory pool of its own): the spread
# between identical graphs. Variants that needed the product patched (module constants such as
# the merge's rounds and warps, the two-row GEMV rule, the sampler's PDL, the runner's carveout)
# are gone; docs/decisions.md has what they measured.
AGAIN = [f"again{n}" for n in range(2, 6)]
ALL = ["full", *AGAIN, *ATTENTION, *GEMV]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b", help="model shape (hotpath.bench.presets)")
    ap.add_argument("--out", default=".", help="directory for variants_<preset>.json")
    ap.add_argument("--rounds", type=int, default=5, help="times every graph is timed, in turn")
    ap.add_argument("--replays", type=int, default=200, help="graph replays a timing")
    ap.add_argument("--batch-size", type=int, default=1, help="sequences decoded a step")
    ap.add_argument("--variants", default=",".join(ALL), help=f"comma-separated, from: {', '.join(ALL)}")
    ns = ap.parse_args()
    names = ns.variants.split(",")
    if unknown := [n for n in names if n not in ALL]:
        raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(ALL)}")
    engine = decoding_engine(ns.preset, ns.batch_size)
    runner = engine.executor.runner
    seqs = list(engine.scheduler.running)
    assert len(seqs) == ns.batch_size
    num_layers = len(runner.model.model.layers)
    # The variants swap two functions while their graph is captured (the layers take no kernel or
    # tile argument): the attention call the layer makes, and the GEMV's tile rule. Only this
    # process sees it, and both are put back before timing.
    attention, choose_config = layer_attention.rope_and_paged_attention, triton_gemv.choose_config
    graphs = {}
    try:
        for name in names:
            layer_attention.rope_and_paged_attention = ATTENTION.get(name, attention)
            table = GEMV.get(name, {})
            triton_gemv.choose_config = lambda M, N, K, device, t=table: (
                t[(N, K)] if (N, K) in t and linear_ops.fma_rows(M, N, K) else choose_config(M, N, K, device))
            runner.graphs = {}
            runner._capture_decode_graphs()
            runner.decode_inputs.fill(seqs, ns.batch_size)
            # the inputs stay referenced: every capture allocates its own
            graphs[name] = (*runner.graphs[ns.batch_size], runner.decode_inputs)
    finally:
        layer_attention.rope_and_paged_attention, triton_gemv.choose_config = attention, choose_config

    # every graph's logits for the same inputs against the first's: GEMV configs change only the
    # order of fp32 sums (attention stand-ins compute something else)
    logits = {}
    for name, (graph, out, _) in graphs.items():
        graph.replay()
        logits[name] = out.float().clone()
    first = logits[names[0]]
    times: dict[str, list[float]] = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(ns.rounds):
        for name, (graph, _, _) in graphs.items():
            for _ in range(20):
                graph.replay()
            start.record()
            for _ in range(ns.replays):
                graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / ns.replays * 1e3)
    base = statistics.median(times["none"]) if "none" in times else None
    result = {"preset": ns.preset, "batch_size": ns.batch_size, "layers": num_layers, "variants": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        row = {"step_us": med, "min_us": min(ts), "max_us": max(ts),
               "logits_max_diff_vs_first": float((logits[name] - first).abs().max())}
        line = f"{ns.preset} {name:>16}: {med:8.1f} us/step  [{min(ts):.1f}, {max(ts):.1f}]"
        if base is not None:
            row["per_layer_over_none_us"] = (med - base) / num_layers
            line += f"  {row['per_layer_over_none_us']:+.2f} us/layer vs none"
        result["variants"][name] = row
        print(line + f"  logits diff {row['logits_max_diff_vs_first']:.3g}")
    Path(ns.out).mkdir(parents=True, exist_ok=True)
    suffix = f"_b{ns.batch_size}" if ns.batch_size > 1 else ""
    (Path(ns.out) / f"variants_{ns.preset}{suffix}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
