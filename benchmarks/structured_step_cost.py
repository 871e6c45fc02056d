"""What structured output adds to a decode step on the GPU: the same batch decoded unconstrained,
then with every row (or half the rows) held to a grammar, in one run on one engine; the median
step, its overhead against the unconstrained step, and the host's mask fill a step (which runs
while the step's forward is on the device: docs/decisions.md, "Structured output").

Random weights at a preset's shape and a real tokenizer (the masks are the tokenizer's), greedy,
async scheduling as the engine defaults it on a GPU. Neither constraint ends within the run, so
every row decodes --output-len tokens as the unconstrained ones do: the regex is free text over a
character class, the JSON an array of at least 100 objects (an H100 run of 2026-12-06 had no
minItems: its rows closed their arrays after 31 tokens on average, no like-for-like figure).

    python benchmarks/structured_step_cost.py --preset qwen3-8b --tokenizer .whl/qwen3-tokenizer \
        --batch-size 1 64 --output-len 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hotpath.args import EngineArgs
from hotpath.bench.presets import preset_dir
from hotpath.engine.engine import Engine
from hotpath.sampling_params import SamplingParams, StructuredOutputsParams

ITEM = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
                                         "ok": {"type": "boolean"}},
        "required": ["id", "name", "tags", "ok"], "additionalProperties": False}
CONSTRAINTS = {"regex": StructuredOutputsParams(regex=r"[a-z ,.]+"),
               "json": StructuredOutputsParams(json={"type": "array", "items": ITEM, "minItems": 100})}


def run(engine: Engine, prompts: list[list[int]], output_len: int, constraint: StructuredOutputsParams | None,
        every: int) -> dict:
    """Decodes `prompts` to output_len tokens, rows i % every == 0 constrained; the decode
    steps' times (one step with tokens to the next, as hotpath/bench/latency.py times them)."""
    for i, p in enumerate(prompts):
        so = constraint if constraint is not None and i % every == 0 else None
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, structured_outputs=so)
        engine.add_request(f"so-{time.monotonic_ns()}-{i}", {"prompt_token_ids": p}, params)
    steps, lengths, started, last = [], [], set(), None
    while engine.has_unfinished_requests():
        outs = engine.step()
        if not outs:
            continue
        now = time.perf_counter()
        if len(started) == len(prompts):  # past the prefill: every row has its first token
            steps.append(now - last)
        started.update(o.request_id for o in outs)
        last = now
        lengths += [len(o.outputs[0].token_ids) for o in outs if o.finished]
    return {"step_median_s": statistics.median(steps), "steps": len(steps),
            "mean_output_len": statistics.fmean(lengths)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-8b")
    ap.add_argument("--tokenizer", default=".whl/qwen3-tokenizer")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    engine = Engine(EngineArgs(model=str(preset_dir(args.preset)), load_format="dummy", tokenizer=args.tokenizer,
                               max_model_len=args.input_len + args.output_len + 8))
    fills = []  # the host's mask fill a step, seconds
    mask = engine.structured.mask

    def timed_mask(seqs):
        start = time.perf_counter()
        out = mask(seqs)
        fills.append(time.perf_counter() - start)
        return out

    engine.structured.mask = timed_mask
    g = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    results = []
    for bs in args.batch_size:
        prompts = [torch.randint(0, vocab, (args.input_len,), generator=g).tolist() for _ in range(bs)]
        run(engine, prompts, 16, CONSTRAINTS["regex"], 1)  # warm-up: graphs, the tokenizer's trie, compiles
        base = run(engine, prompts, args.output_len, None, 1)
        results.append({"batch_size": bs, "mode": "none", **base})
        print(f"batch {bs:3d} unconstrained: step {base['step_median_s'] * 1e3:.3f} ms", flush=True)
        for name, constraint in CONSTRAINTS.items():
            for every, label in ((1, "all rows"), (2, "half the rows")):
                if every == 2 and bs == 1:
                    continue
                fills.clear()
                r = run(engine, prompts, args.output_len, constraint, every)
                r.update(batch_size=bs, mode=f"{name}, {label}", fill_median_s=statistics.median(fills),
                         overhead=r["step_median_s"] / base["step_median_s"] - 1)
                results.append(r)
                print(f"batch {bs:3d} {name:5s} {label:13s}: step {r['step_median_s'] * 1e3:.3f} ms "
                      f"({r['overhead'] * 100:+.1f}%), mask fill {r['fill_median_s'] * 1e3:.3f} ms a step, "
                      f"mean output {r['mean_output_len']:.0f} tokens", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
