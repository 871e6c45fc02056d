"""TTFT of one prompt, repeated in one process: the bench's TTFT is a single sample, this shows the
spread. Four requests one after another (the first compiles); prints, for each, the milliseconds
since submission at which its first three engine steps returned (and how many outputs each had).

    PRESET=qwen3-8b python scripts/ttft_repeat.py
"""

import os
import time

from hotpath.bench.presets import preset_dir
from hotpath.engine.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.sampling_params import SamplingParams

engine = Engine(EngineArgs(model=str(preset_dir(os.environ.get("PRESET", "qwen3-8b"))),
                           load_format="dummy", skip_tokenizer_init=True, max_model_len=1024,
                           max_num_seqs=1, enable_prefix_caching=False, num_gpu_blocks_override=128))
prompt = list(range(100, 612))
for rep in range(4):
    start = time.perf_counter()
    engine.add_request(f"r{rep}", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    steps = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps.append((round((time.perf_counter() - start) * 1e3, 2), len(outs)))
    print(f"request {rep}: {steps[:3]}", flush=True)
