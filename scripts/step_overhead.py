"""What the stream carries around a batch-1 decode graph, and what the bench's TPOT pays for it:
two engines built as `hotpath bench latency` builds them, one whose graphs write their greedy
tokens into mapped host memory (the default) and one that copies them back (MAPPED_OUT off, the
code before), each timed in turn over the bench's own loop, so the two compare within one run.
For each engine also: the graph replayed back to back, and with each step's input copy before it.

    python scripts/step_overhead.py --preset qwen3-0.6b --rounds 3 --out DIR
"""

import argparse
import json
import statistics
from pathlib import Path

import torch

from hotpath.bench import latency
from hotpath.bench.presets import preset_dir
from hotpath.engine.engine import Engine
from hotpath.runner import decode_inputs
from hotpath.sampling_params import SamplingParams


def build(preset: str, mapped: bool, input_len: int, output_len: int) -> Engine:
    """An engine with the bench's arguments (batch 1) and graphs captured with or without the
    mapped host output."""
    # two engines live at once: each takes under half of the GPU
    ns = argparse.Namespace(input_len=input_len, output_len=output_len, batch_size=1, load_format="dummy",
                            dtype="bfloat16", enforce_eager=False, async_scheduling=True,
                            gpu_memory_utilization=0.45)
    kept = decode_inputs.MAPPED_OUT
    decode_inputs.MAPPED_OUT = mapped
    try:
        return Engine(latency.engine_args(ns, str(preset_dir(preset))))
    finally:
        decode_inputs.MAPPED_OUT = kept


def replay_us(engine: Engine, with_inputs: bool, steps: int = 200) -> float:
    """The mean of `steps` back-to-back replays of the batch-1 graph, timed with events,
    optionally each after the step's input copy (what an async step sends when no table changed:
    its token id is the last step's, in place on the device)."""
    runner = engine.runner
    graph, _ = runner.graphs[1]
    seqs = engine.scheduler.running[:1]
    ids = runner.decode_inputs.token_ids[:1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        if with_inputs:
            runner.decode_inputs.fill(seqs, 1, (ids, [0]))
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--out", default=".")
    ns = ap.parse_args()
    engines = {name: build(ns.preset, name == "mapped", ns.input_len, ns.output_len)
               for name in ("copies", "mapped")}
    g = torch.Generator().manual_seed(0)
    vocab = engines["mapped"].model_config.vocab_size
    prompt = [torch.randint(0, vocab, (ns.input_len,), generator=g).tolist()]
    tpot: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        latency._run_batch(engine, prompt, 8)  # warm-up, as the bench
    for _ in range(ns.rounds):
        for name, engine in engines.items():
            _, steps = latency._run_batch(engine, prompt, ns.output_len)
            tpot[name].append(sum(steps) / len(steps) * 1e6)
    result = {"preset": ns.preset, "tpot_us": tpot}
    for name, engine in engines.items():
        # a sequence to replay: one request left decoding
        engine.add_request("replay", {"prompt_token_ids": prompt[0]},
                           SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        for _ in range(4):
            engine.step()
        result[f"{name}_replay_us"] = replay_us(engine, False)
        result[f"{name}_replay_with_inputs_us"] = replay_us(engine, True)
        engine.abort_request("replay")
    for name in engines:
        t = statistics.median(tpot[name])
        print(f"{ns.preset} {name}: TPOT median {t:.1f} us over {ns.rounds} rounds {tpot[name]}; graph "
              f"replay {result[f'{name}_replay_us']:.1f} us, with the input copy "
              f"{result[f'{name}_replay_with_inputs_us']:.1f} us")
    out = Path(ns.out) / f"step_overhead_{ns.preset}.json"
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
