"""What decode attention costs inside the batch-1 decode graph, by replacing it: the same engine's
decode graph captured again with attention swapped for variants (none at all; a kernel that only
waits and copies its input; the real kernel with other launch parameters), every graph replayed
in turn in one process, so the step times compare within one run.

    python scripts/attention_ablation.py --preset qwen3-0.6b --out DIR

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
from hotpath.ops.attention import triton_decode
from hotpath.ops.rotary import qk_norm_rope_and_cache
from hotpath.ops.triton_utils import pdl_enabled, pdl_launch_dependents, pdl_wait
from profile_decode import decoding_engine  # scripts/ is on the path when run as a script


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


VARIANTS = {
    "full": _fused(),
    "none": lambda q, *args: q,
    "copy": _copy,
    "unfused": _unfused,
    "direct": _fused(num_splits=1),
    "splits4": _fused(num_splits=4),
    "splits26_bn32": _fused(num_splits=26, block_n=32),
    "stages1": _fused(num_stages=1),
    "warps2": _fused(num_warps=2),
    "warps8": _fused(num_warps=8),
    "x_prefetch": _fused(ablate=1),
    "x_merge": _fused(ablate=2),
    "x_tiles": _fused(ablate=4),
    "x_tiles_merge": _fused(ablate=6),
    "x_normrope": _fused(ablate=8),
    "x_cachewrite": _fused(ablate=16),
    "x_all": _fused(ablate=31),
    "d256w8s1": _fused(num_splits=1, block_n=256, num_warps=8, num_stages=1),
    "d128w8": _fused(num_splits=1, block_n=128, num_warps=8),
    "d128w4": _fused(num_splits=1, block_n=128, num_warps=4),
    "s3_256w8s1": _fused(num_splits=3, block_n=256, num_warps=8, num_stages=1),
    "s3_256w4s1": _fused(num_splits=3, block_n=256, num_warps=4, num_stages=1),
    "s5_128w8": _fused(num_splits=5, block_n=128, num_warps=8),
    "s5_128w4": _fused(num_splits=5, block_n=128, num_warps=4),
    "s9_64": _fused(num_splits=9, block_n=64),
    "s9_64w8": _fused(num_splits=9, block_n=64, num_warps=8),
    "x_dots": _fused(ablate=32),
    "x_tileloads": _fused(ablate=64),
}
TRACE = torch.zeros(0)


def _traced(q, *args):
    return _fused(trace=TRACE)(q, *args)


VARIANTS["trace"] = _traced


def trace_report(buf: torch.Tensor, num_kv_heads: int) -> dict:
    """Phases of the split programs of the last layer, from the clocks they stored."""
    t = buf.cpu().long()
    used = t[t[:, 7] != 0]
    merger = t[t[:, 12] != 0]
    names = ["pre-wait issue", "wait", "qkv rows in", "norm+rope", "cache write+barrier",
             "tile loop", "partials+atomic"]
    rep = {}
    for i, name in enumerate(names):
        d = (used[:, i + 2] - used[:, i + 1]).float()
        rep[name + " (cycles, median over programs)"] = float(d.median())
    rep["merge loads (cycles)"] = float((merger[:, 9] - merger[:, 8]).float().median())
    rep["merge tail (cycles)"] = float((merger[:, 11] - merger[:, 9]).float().median())
    rep["start to wait release (ns, globaltimer)"] = float((used[:, 10] - used[:, 0]).float().median())
    rep["wait release spread across programs (ns)"] = float(used[:, 10].max() - used[:, 10].min())
    rep["start spread across programs (ns)"] = float(used[:, 0].max() - used[:, 0].min())
    rep["first wait release to last merge end (ns)"] = float(merger[:, 12].max() - used[:, 10].min())
    rep["wait release to merge end, per merger (ns)"] = float((merger[:, 12] - merger[:, 10]).float().median())
    rep["programs traced"] = [int(used.shape[0]), int(merger.shape[0])]
    return rep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ns = ap.parse_args()
    engine = decoding_engine(ns.preset)
    runner = engine.runner
    seqs = [engine.scheduler.running[0]]
    num_layers = len(runner.model.model.layers)
    global TRACE
    TRACE = torch.zeros((4096, 16), dtype=torch.int64, device="cuda")
    graphs = {}
    for name in ns.variants.split(","):
        layer_attention.rope_and_paged_attention = VARIANTS[name]
        runner.graphs = {}
        runner._capture_decode_graphs()
        runner.decode_inputs.fill(seqs, 1)
        # the inputs stay referenced: every capture allocates its own
        graphs[name] = (runner.graphs[1][0], runner.decode_inputs)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(ns.rounds):
        for name, (graph, _) in graphs.items():
            for _ in range(20):
                graph.replay()
            start.record()
            for _ in range(ns.replays):
                graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / ns.replays * 1e3)
    base = statistics.median(times["none"]) if "none" in times else None
    result = {"preset": ns.preset, "layers": num_layers, "variants": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        row = {"step_us": med, "min_us": min(ts), "max_us": max(ts)}
        if base is not None:
            row["per_layer_over_none_us"] = (med - base) / num_layers
        result["variants"][name] = row
        print(f"{ns.preset} {name:>14}: {med:8.1f} us/step  [{min(ts):.1f}, {max(ts):.1f}]"
              + (f"  {row['per_layer_over_none_us']:+.2f} us/layer vs none" if base else ""))
    if "trace" in graphs:
        TRACE.zero_()
        graphs["trace"][0].replay()
        torch.cuda.synchronize()
        result["trace"] = trace_report(TRACE, runner.model_config.num_key_value_heads if hasattr(runner, "model_config") else 8)
        print(json.dumps(result["trace"], indent=1))
    Path(ns.out).mkdir(parents=True, exist_ok=True)
    (Path(ns.out) / f"ablation_{ns.preset}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
