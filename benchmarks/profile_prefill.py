"""Where a long prompt's prefill spends its GPU time: one prompt of --input-len tokens through an
engine at the user's defaults (LLM(model), random weights at the preset's shape), its prefill
steps profiled with torch.profiler, kernels grouped by name and sorted by GPU time.

    python benchmarks/profile_prefill.py --preset qwen3.5-35b-a3b --input-len 32768 --out DIR
"""

import argparse
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="qwen3.5-35b-a3b")
ap.add_argument("--input-len", type=int, default=32768)
ap.add_argument("--out", default=".")
ns = ap.parse_args()

llm = LLM(str(preset_dir(ns.preset)), load_format="dummy", skip_tokenizer_init=True)
vocab = llm.engine.model_config.vocab_size
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
g = torch.Generator().manual_seed(0)


def prompt(n: int) -> dict:
    return {"prompt_token_ids": torch.randint(10, vocab - 10, (n,), generator=g).tolist()}


llm.generate([prompt(ns.input_len)], params, use_tqdm=False)  # warm-up (compiles, autotunes)
torch.cuda.synchronize()
t = time.perf_counter()
llm.generate([prompt(ns.input_len)], params, use_tqdm=False)
torch.cuda.synchronize()
wall_ms = (time.perf_counter() - t) * 1e3
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    llm.generate([prompt(ns.input_len)], params, use_tqdm=False)
    torch.cuda.synchronize()
rows = sorted(((e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages()),
              key=lambda r: -r[2])
total = sum(r[2] for r in rows)
res = {"preset": ns.preset, "input_len": ns.input_len, "wall_ms": wall_ms, "gpu_ms": total,
       "kernels": [{"name": n[:90], "count": c, "ms": ms} for n, c, ms in rows[:30]]}
Path(ns.out).mkdir(parents=True, exist_ok=True)
(Path(ns.out) / f"prefill_profile_{ns.preset}_{ns.input_len}.json").write_text(json.dumps(res, indent=1))
print(f"{ns.preset} {ns.input_len} tokens: {wall_ms:.1f} ms wall, {total:.1f} ms of kernels")
for r in res["kernels"][:25]:
    print(f"{r['ms']:9.2f} ms {r['count']:6d}  {r['name']}")
