"""Where the decode graph's time goes (batch 1, or --batch-size B), kernel by kernel, as it
replays (PDL overlaps included): each kernel's own duration, and the time it adds to the step, its end minus the end of
the kernel before it. Kernels run one after the other apart from PDL's overlap, so the second
figure sums to the replay time, and what a kernel adds beyond moving its bytes is its overhead.

    python benchmarks/decode_timeline.py --preset qwen3-0.6b --out DIR
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from profile_decode import decoding_engine  # benchmarks/ is on the path when run as a script


def label_kernels(names: list[str], roles: tuple[str, ...] = ("qkv", "o_proj", "gate_up", "down")) -> list[str]:
    """A role for each kernel of one step: GEMVs by their place in a layer (`roles`, in launch
    order; the step's last one is the LM head), attention by kernel name."""
    labels = []
    gemvs_seen = 0
    for name in names:
        if "gemv" in name:
            labels.append(roles[gemvs_seen % len(roles)])
            gemvs_seen += 1
        elif "decode_split" in name:
            labels.append("attention")
        elif "merge_head" in name:
            labels.append("attention merge")
        else:
            labels.append(name[:40])
    # the step's last GEMV is the LM head where one GEMV is left over from the layers' four (with
    # a few rows the LM head may be cuBLAS's)
    if gemvs_seen % len(roles) == 1:
        labels[max(i for i, n in enumerate(names) if "gemv" in n)] = "lm_head"
    return labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--out", default=".")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1, help="sequences decoded a step")
    ns = ap.parse_args()
    engine = decoding_engine(ns.preset, ns.batch_size)
    graph, _ = engine.executor.runner.graphs[ns.batch_size]
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        graph.replay()
    end.record()
    end.synchronize()
    replay_us = start.elapsed_time(end) / 100 * 1e3

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(ns.replays):
            graph.replay()
            torch.cuda.synchronize()  # a gap between replays marks where each one starts
    kernels = sorted(
        ((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
         if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()
         and "memset" not in e.name.lower()),
    )
    # split into replays at the host sync gaps
    replays, cur = [], [kernels[0]]
    for k in kernels[1:]:
        if k[0] - cur[-1][1] > 20:  # us
            replays.append(cur)
            cur = []
        cur.append(k)
    replays.append(cur)
    per_step = max(set(len(r) for r in replays), key=[len(r) for r in replays].count)
    replays = [r for r in replays if len(r) == per_step]
    # an MoE layer's GEMVs are qkv, o_proj and the router (its experts run the MoE kernels)
    moe = engine.model_config.moe is not None
    labels = label_kernels([k[2] for k in replays[0]], ("qkv", "o_proj", "router") if moe else
                           ("qkv", "o_proj", "gate_up", "down"))

    dur, adds = defaultdict(list), defaultdict(list)
    totals = []
    for r in replays:
        totals.append(r[-1][1] - r[0][0])
        prev_end = r[0][0]
        for (s, e, _), lab in zip(r, labels):
            dur[lab].append(e - s)
            adds[lab].append(e - prev_end)
            prev_end = max(prev_end, e)
    n = len(replays)
    rows = []
    for lab in dur:
        count = len(dur[lab]) // n
        rows.append({"kernel": lab, "per_step": count,
                     "duration_us": sum(dur[lab]) / len(dur[lab]),
                     "adds_us": sum(adds[lab]) / len(adds[lab]),
                     "adds_per_step_us": sum(adds[lab]) / n})
    rows.sort(key=lambda r: -r["adds_per_step_us"])
    # one replay kernel by kernel (a hybrid's layers do not follow the dense roles above)
    first, prev_end = [], replays[0][0][0]
    for s, e, name in replays[0]:
        first.append({"kernel": name[:60], "duration_us": e - s, "adds_us": e - prev_end})
        prev_end = max(prev_end, e)
    res = {"preset": ns.preset, "batch_size": ns.batch_size, "replay_us_events": replay_us,
           "profiled_step_us": sum(totals) / n, "kernels_per_step": per_step, "rows": rows,
           "one_replay": first}
    Path(ns.out).mkdir(parents=True, exist_ok=True)
    suffix = f"_b{ns.batch_size}" if ns.batch_size > 1 else ""
    (Path(ns.out) / f"timeline_{ns.preset}{suffix}.json").write_text(json.dumps(res, indent=1))
    print(f"{ns.preset}: graph replay {replay_us:.1f} us (events), profiled step "
          f"{res['profiled_step_us']:.1f} us, {per_step} kernels")
    print(f"{'kernel':<42} {'n':>4} {'dur us':>8} {'adds us':>8} {'step us':>8}")
    for r in rows:
        print(f"{r['kernel']:<42} {r['per_step']:>4} {r['duration_us']:>8.2f} {r['adds_us']:>8.2f} "
              f"{r['adds_per_step_us']:>8.1f}")


if __name__ == "__main__":
    main()
