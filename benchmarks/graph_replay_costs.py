"""What a batch-1 decode step costs on the device beyond its graph: the graph replayed back to
back (and a second capture of it, as benchmarks/decode_variants.py makes), against the same graph
behind each step's input copy (DecodeInputs.fill), against the engine's own loop (async
scheduling, as `hotpath bench latency` runs it).

    python benchmarks/graph_replay_costs.py --preset qwen3-0.6b [--steps 200] [--out DIR]
"""

import argparse
import json
import time
from pathlib import Path

import torch

from profile_decode import decoding_engine  # benchmarks/ is on the path when run as a script


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b", help="model shape (hotpath.bench.presets)")
    ap.add_argument("--steps", type=int, default=200, help="steps timed in each way")
    ap.add_argument("--out", default=None, help="directory for graph_replay_costs_<preset>.json")
    ns = ap.parse_args()
    engine = decoding_engine(ns.preset)  # no step in flight: the next step's inputs are valid
    runner = engine.executor.runner
    graph = runner.graphs[1][0]
    seqs = list(engine.scheduler.running)

    def replays() -> None:
        for _ in range(ns.steps):
            graph.replay()

    def fill_and_replay() -> None:
        for _ in range(ns.steps):
            runner.decode_inputs.fill(seqs, 1)
            graph.replay()

    def engine_loop() -> None:
        engine.async_scheduling = True  # as the bench runs it
        for _ in range(ns.steps):
            engine.step()

    def recaptured() -> None:
        for _ in range(ns.steps):
            again.replay()

    # the graph captured again, as benchmarks/decode_variants.py captures its variants (the first
    # kept alive, with its inputs)
    first = (runner.graphs, runner.decode_inputs)
    runner.graphs = {}
    runner._capture_decode_graphs()
    again = runner.graphs[1][0]
    runner.decode_inputs.fill(seqs, 1)
    second = (runner.graphs, runner.decode_inputs)  # what `again` reads stays alive
    runner.graphs, runner.decode_inputs = first

    res = {"preset": ns.preset}
    for name, fn in (("graph_replay_us", replays), ("recaptured_graph_replay_us", recaptured),
                     ("graph_replay_us_again", replays), ("fill_and_replay_us", fill_and_replay),
                     ("engine_step_us", engine_loop)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        res[name] = (time.perf_counter() - t) / ns.steps * 1e6
    # the host's cost of one replay call, the device idle (a graph of ~170 kernels with PDL edges)
    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        graph.replay()
        times.append((time.perf_counter() - t) * 1e6)
    res["replay_call_host_us"] = sorted(times)[len(times) // 2]
    # the device's time for back-to-back replays, by events
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replays()
    end.record()
    end.synchronize()
    res["graph_replay_events_us"] = start.elapsed_time(end) / ns.steps * 1e3
    print(json.dumps(res))
    if ns.out:
        Path(ns.out).mkdir(parents=True, exist_ok=True)
        (Path(ns.out) / f"graph_replay_costs_{ns.preset}.json").write_text(json.dumps(res, indent=1))
    del second


if __name__ == "__main__":
    main()
