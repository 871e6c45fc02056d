"""The default-settings script of issue 18, as a new user runs it: a fresh process, hotpath the
first CUDA user. Usage: python scripts/crash_repro.py [PRESET] [ENGINE_KWARGS_JSON]."""

import json
import sys
import time

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir

preset = sys.argv[1] if len(sys.argv) > 1 else "qwen3-8b"
kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
t = time.perf_counter()
llm = LLM(model=str(preset_dir(preset)), load_format="dummy", dtype="bfloat16", device="cuda",
          skip_tokenizer_init=True, **kwargs)
built = time.perf_counter() - t
out = llm.generate([{"prompt_token_ids": list(range(100, 612))}], SamplingParams(temperature=0, max_tokens=16))
assert len(out[0].outputs[0].token_ids) == 16
print(json.dumps({"preset": preset, "kwargs": kwargs, "ok": True, "build_s": round(built, 1),
                  "max_model_len": llm.engine.config.max_model_len,
                  "kv_tokens": llm.engine.executor.runner.num_blocks * llm.engine.config.block_size}))
