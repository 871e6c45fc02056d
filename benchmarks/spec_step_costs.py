"""Speculative decoding's step costs on the GPU, and the speed-up they give with a measured
acceptance: a model, not a measurement of the pair end to end.

Random weights at a target's shape (and a draft model's), so nothing says what would be accepted:
each k in --ks is forced (the engine's policy fixed at k) and the decode steps are timed, median
of one batch's steps after a warm-up. A step with k drafts costs T(k): the draft model's catch-up
and k - 1 one-token steps (with --draft-preset), and the target's verify step over 1 + k tokens a
sequence. With --verify-only the drafts are the last token repeated (no draft model): what an
n-gram step costs (its lookup is host work of tens of microseconds, not counted). With --mtp the
checkpoint's multi-token-prediction head drafts (a Qwen3-Next / Qwen3.5 shape): T(0) then
includes the head's catch-up over each step's token, which it runs whether or not it drafts.

With --acceptance (a spec_acceptance.py JSON of the real pair, greedy), the modelled speed-up at
each k: a draft-model workload's expected tokens a verify step E(k) (the replay of its outputs at
each k) over T(k), against one token over T(0); an n-gram workload's steps with and without a
match (a step without one decodes plainly, at T(0)).

    python benchmarks/spec_step_costs.py --preset qwen2.5-coder-32b --draft-preset qwen2.5-coder-0.5b \
        --acceptance docs/bench/spec_acceptance_draft_model.json --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hotpath.bench.latency import _run_batch
from hotpath.bench.presets import preset_dir
from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.speculative.drafters import NgramDrafter


class RepeatLastToken(NgramDrafter):
    """Drafts that cost nothing: each sequence's last token, as many times as it has slots."""

    def propose(self, seqs, slots) -> None:
        for seq, k in zip(seqs, slots):
            seq.draft_token_ids, seq.draft_probs = [seq.all_token_ids[-1]] * k, None


def step_times(engine: Engine, k: int, batch_size: int, input_len: int, output_len: int) -> dict:
    # the benchmark fixes the policy's k (a user sets num_speculative_tokens and adaptive instead)
    engine.spec_policy.max_drafts = k
    g = torch.Generator().manual_seed(k)
    vocab = engine.model_config.vocab_size
    warm, timed = ([torch.randint(0, vocab, (input_len,), generator=g).tolist() for _ in range(batch_size)]
                   for _ in range(2))
    _run_batch(engine, warm, 8)
    rows_before = engine.spec_stats.num_drafts
    _, steps = _run_batch(engine, timed, output_len)
    return {"k": k, "batch_size": batch_size, "step_median_s": statistics.median(steps),
            "step_mean_s": statistics.fmean(steps), "steps": len(steps),
            "verify_rows": engine.spec_stats.num_drafts - rows_before}  # a sequence's drafts verified in a step


def modelled(costs: dict[int, float], acceptance: dict) -> dict:
    """Speed-up at each measured k > 0 for each workload of a spec_acceptance.py result."""
    out = {}
    for name, w in acceptance["runs"][0]["workloads"].items():
        per_k = w["replay"]["per_k"]
        emitted = w["output_tokens"] - w["num_prompts"]  # decode steps without speculation
        row = {}
        for k, t in sorted(costs.items()):
            if k == 0 or str(k) not in per_k:
                continue
            r = per_k[str(k)]
            verify, plain = r["num_verify_steps"], r["decode_steps"] - r["num_verify_steps"]
            time_spec = verify * t + plain * costs[0]
            row[k] = {"tokens_per_verify_step": r["mean_accepted_length"], "speedup": emitted * costs[0] / time_spec}
        out[name] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, help="the target's shape (hotpath.bench.presets)")
    ap.add_argument("--draft-preset", help="the draft model's shape; without it, --verify-only")
    ap.add_argument("--verify-only", action="store_true", help="drafts cost nothing (n-gram's case)")
    ap.add_argument("--mtp", action="store_true", help="the checkpoint's MTP head drafts (hybrid presets)")
    ap.add_argument("--ks", default="0,1,2,3,4,5,7", help="draft counts to time (0: plain decode)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1])
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--acceptance", help="spec_acceptance.py JSON: model the speed-up from it")
    ap.add_argument("--json", help="write the results here")
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    ks = [int(k) for k in ns.ks.split(",")]
    if ns.draft_preset:
        spec = {"method": "draft_model", "model": str(preset_dir(ns.draft_preset))}
    elif ns.verify_only:
        spec = {"method": "ngram"}
    elif ns.mtp:
        spec = {"method": "mtp"}
    else:
        ap.error("give --draft-preset, --verify-only or --mtp")
    spec.update(num_speculative_tokens=max(ks), adaptive=False)
    engine = Engine(EngineArgs(model=str(preset_dir(ns.preset)), load_format="dummy", skip_tokenizer_init=True,
                               speculative_config=spec))
    if ns.verify_only:
        engine.drafter = RepeatLastToken(engine.spec_config)
    results = [step_times(engine, k, bs, ns.input_len, ns.output_len) for bs in ns.batch_size for k in ks]
    out = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
           "target": ns.preset, "draft": ns.draft_preset or ("mtp head" if ns.mtp else "none (drafts cost nothing)"),
           "steps": results}
    for bs in ns.batch_size:
        costs = {r["k"]: r["step_median_s"] for r in results if r["batch_size"] == bs}
        print(f"batch {bs}: " + "  ".join(f"T({k}) = {t * 1e3:.2f} ms" for k, t in costs.items()))
        if ns.acceptance and bs == 1 and 0 in costs:
            model = modelled(costs, json.loads(Path(ns.acceptance).read_text()))
            out["modelled_speedup_batch1"] = model
            for name, row in model.items():
                best = max(row, key=lambda k: row[k]["speedup"])
                print(f"  {name}: " + "  ".join(f"k={k} {v['speedup']:.2f}x" for k, v in row.items())
                      + f"  (best k = {best})")
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
