"""Where a batch-1 decode step's time goes on the GPU: graph replay alone vs the engine's step,
a cProfile of the engine loop, and the per-kernel GPU time of one eager forward.

    python benchmarks/profile_decode.py --preset qwen3-8b --out DIR
"""

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from hotpath.bench.presets import preset_dir
from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.sampling_params import SamplingParams


def decoding_engine(preset: str, batch_size: int = 1) -> Engine:
    """An engine (random weights at the preset's shape) 20 steps into decoding `batch_size`
    sequences after a 512-token prompt each, with no step in flight (async scheduling off)."""
    engine = Engine(EngineArgs(model=str(preset_dir(preset)), load_format="dummy",
                               skip_tokenizer_init=True, max_model_len=1024, max_num_seqs=batch_size,
                               enable_prefix_caching=False, num_gpu_blocks_override=128 * batch_size,
                               async_scheduling=False))
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for i in range(batch_size):
        engine.add_request(f"r{i}", {"prompt_token_ids": list(range(100 + i, 612 + i))}, params)
    for _ in range(20):
        engine.step()
    return engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-8b")
    ap.add_argument("--out", default=".")
    ns = ap.parse_args()
    out = Path(ns.out)
    engine = decoding_engine(ns.preset)

    steps = 100
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step_ms = (time.perf_counter() - t) / steps * 1e3

    graph, logits = engine.executor.runner.graphs[1]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    replay_ms = start.elapsed_time(end) / steps

    t = time.perf_counter()
    for _ in range(steps):
        graph.replay()
        logits.argmax(-1).tolist()
    replay_sync_ms = (time.perf_counter() - t) / steps * 1e3

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        engine.step()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    (out / f"cprofile_{ns.preset}.txt").write_text(s.getvalue())

    # per-kernel GPU time of one eager decode forward, through the same ops
    runner = engine.executor.runner
    seq = engine.scheduler.running[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            input_ids, positions, batch, _ = runner._prepare([(seq, 1)])
            with torch.inference_mode():
                runner.model.compute_logits(runner.model(input_ids, positions, batch))
        torch.cuda.synchronize()
    table = p.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    (out / f"kernels_{ns.preset}.txt").write_text(table)
    res = {"preset": ns.preset, "step_ms": step_ms, "graph_replay_gpu_ms": replay_ms,
           "replay_argmax_tolist_ms": replay_sync_ms}
    print(json.dumps(res))
    (out / f"profile_{ns.preset}.json").write_text(json.dumps(res))
    print(table)


if __name__ == "__main__":
    main()
