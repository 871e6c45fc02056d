"""Qwen3-235B-A22B FP8 on 8 GPUs, as a model: each rank's share of the step as its own config
(attention heads, expert widths or experts, vocabulary rows at TP8 and at EP8), timed on one GPU
with `hotpath bench latency`, plus the all-reduces that the step adds, from figures measured
elsewhere (PERF.md). Modelled, not measured on 8 GPUs: the multi-GPU issue checks it.

    python benchmarks/qwen3_235b_ranks.py write DIR        # the per-rank configs, one folder each
    python benchmarks/qwen3_235b_ranks.py model DIR OUT    # the table from bench latency's JSONs

Per rank (8 ranks): 8 query heads and one KV head (4 KV heads replicated in pairs), hidden 4096,
94 layers, the LM head's and embedding's vocabulary / 8 rows. TP8: all 128 experts at width
1536 / 8 = 192 (a rank's width not a multiple of the 128-row fp8 block). EP8: 16 whole experts
(width 1536) a rank; the tokens' 8 routed experts spread over the ranks: at batch 1 the busiest
rank serves about 2 of them (top-k 2 of its 16), at batch 64 each rank about 64 token-expert
pairs (top-k 1 of 16 per token).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hotpath.bench.presets import PRESETS  # noqa: E402
from hotpath.quantizer import formats  # noqa: E402

RANKS = 8
LAYERS = 94
# all-reduces a token's step does: two a layer (attention, MoE), the embedding's; and the LM
# head's all-gather of the sampled rows
COLLECTIVES = 2 * LAYERS + 2
# published one-message latencies on 8 NVLink GPUs (PERF.md): NCCL 20-33 us for 8 KiB, a one-shot
# Triton all-reduce ~11 us, a fused all-reduce + RMSNorm ~5 us; at batch 64 (512 KiB) NCCL's ring
# is assumed at ~40 us and the one-shot kernel at ~20 us (to be measured: issue 37)
ALLREDUCE_US = {1: {"nccl": 25.0, "one_shot": 11.0, "fused": 5.0}, 64: {"nccl": 40.0, "one_shot": 20.0, "fused": 15.0}}


def rank_configs() -> dict[str, dict]:
    base = dict(PRESETS["qwen3-235b-a22b"], num_attention_heads=64 // RANKS, num_key_value_heads=1,
                vocab_size=151936 // RANKS, quantization_config=formats.fp8_block_config([]))
    return {
        "tp8": dict(base, moe_intermediate_size=1536 // RANKS),
        "ep8_bs1": dict(base, num_experts=128 // RANKS, num_experts_per_tok=2),
        "ep8_bs64": dict(base, num_experts=128 // RANKS, num_experts_per_tok=1),
    }


def write(out: Path) -> None:
    for name, cfg in rank_configs().items():
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps(cfg, indent=2))
        print(out / name)


def model(results: Path, out: Path) -> None:
    rows = []
    for layout, runs in (("TP8", {1: "tp8", 64: "tp8"}), ("EP8", {1: "ep8_bs1", 64: "ep8_bs64"})):
        for batch, name in runs.items():
            path = results / f"rank_{name}.json"
            if not path.exists():
                continue
            data = json.loads(path.read_text())
            r = next(x for x in (data if isinstance(data, list) else [data]) if x["batch_size"] == batch)
            step_ms = r["tpot_s"] * 1e3
            row = {"layout": layout, "batch": batch, "rank_step_ms": step_ms,
                   "rank_roofline_ms": r["roofline_tpot_s"] * 1e3}
            for kind, us in ALLREDUCE_US[batch].items():
                row[f"tpot_ms_{kind}"] = step_ms + COLLECTIVES * us / 1e3
            rows.append(row)
    out.write_text(json.dumps(rows, indent=2))
    print(f"{'layout':6} {'batch':>5} {'rank step':>10} {'+NCCL':>8} {'+one-shot':>10} {'+fused':>8}  (ms)")
    for r in rows:
        print(f"{r['layout']:6} {r['batch']:5d} {r['rank_step_ms']:10.3f} {r['tpot_ms_nccl']:8.3f} "
              f"{r['tpot_ms_one_shot']:10.3f} {r['tpot_ms_fused']:8.3f}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "model":
        model(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
