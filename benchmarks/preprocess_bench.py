"""Image preprocessing on the host, as the server's front end runs it: N random PNG data URLs
(the benchmark's images) through MultiModalProcessor one after another, on N threads (torch's
intra-op threads at their default and at 1), and on a pool of processes. Where the server's
time-to-first-token under concurrent image requests goes, before the engine sees them.

    python benchmarks/preprocess_bench.py --preset qwen3-vl-8b --num-images 16 --image-size 1280x1280
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image

from hotpath.bench.presets import preset_dir
from hotpath.models.registry import read_config
from hotpath.multimodal.media import MediaPolicy
from hotpath.multimodal.processor import MultiModalProcessor

_processor = None


def _init(model_dir: str) -> None:
    global _processor
    mm = read_config(model_dir).multimodal
    ids = {f"{k}_token_id": getattr(mm, f"{k}_token_id") for k in ("image", "video", "vision_start", "vision_end")}
    _processor = MultiModalProcessor.from_model_dir(model_dir, ids, None, MediaPolicy())
    _processor.ids = [mm.vision_start_token_id, mm.image_token_id, mm.vision_end_token_id, 5]


def _process(url: str) -> int:
    return _processor.process(_processor.ids, {"image": [url]}).mm_items[0].num_tokens


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(ns: argparse.Namespace) -> dict:
    model_dir = str(preset_dir(ns.preset))
    _init(model_dir)
    width, height = (int(x) for x in ns.image_size.split("x"))
    rng = np.random.default_rng(0)
    urls = []
    for _ in range(ns.num_images):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    _process(urls[0])
    out = {"cpus": os.cpu_count(), "num_images": ns.num_images, "image_size": ns.image_size,
           "torch_threads": torch.get_num_threads()}
    out["serial_s"] = _timed(lambda: [_process(u) for u in urls])
    with ThreadPoolExecutor(ns.num_images) as ex:
        out["threads_s"] = _timed(lambda: list(ex.map(_process, urls)))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        out["threads_torch1_s"] = _timed(lambda: list(ex.map(_process, urls)))
        torch.set_num_threads(threads)
    workers = min(ns.num_images, os.cpu_count() or 1)
    # spawned: a forked child of a process with OpenMP threads can deadlock
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                             initargs=(model_dir,)) as ex:
        list(ex.map(_process, urls[:workers]))  # started and warm
        out["processes"] = workers
        out["processes_s"] = _timed(lambda: list(ex.map(_process, urls)))
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-vl-8b")
    p.add_argument("--num-images", type=int, default=16)
    p.add_argument("--image-size", default="1280x1280")
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    result = main(ns)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
