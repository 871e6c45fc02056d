"""`hotpath bench latency --images N --image-size WxH`: prompts with images for an image-text model,
the vision tower timed alone against the matmul peak, and HF transformers on the same prompts.

Images are random pixels of the given size, preprocessed as a user's would be (the checkpoint's
processor settings) before the clock starts: the server does that in its front end, beside the
engine's loop. Each run takes fresh images, so the encoder cache never serves a timed one."""

from __future__ import annotations

import functools
import time

import numpy as np
import torch

from hotpath.bench import roofline
from hotpath.engine.engine import Engine
from hotpath.multimodal.inputs import ProcessedPrompt, normalise_pixels

# text tokens are drawn below every special token of the Qwen vocabularies
_TEXT_IDS = 151000


def parse_size(text: str) -> tuple[int, int]:
    """"WxH" -> (width, height)."""
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--image-size takes WIDTHxHEIGHT, e.g. 1280x1280; got {text!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"--image-size must be positive, got {text!r}")
    return w, h


def random_images(n: int, size: tuple[int, int], rng: np.random.Generator) -> list[np.ndarray]:
    w, h = size
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def image_prompts(engine: Engine, batch_size: int, num_images: int, size: tuple[int, int], text_len: int,
                  seed: int) -> list[ProcessedPrompt]:
    """batch_size prompts of num_images images each, then text_len random text tokens."""
    mm = engine.model_config.multimodal
    if mm is None:
        raise ValueError(f"--images needs an image-text model; {engine.model_config.architecture} is not one")
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(batch_size):
        ids = [mm.vision_start_token_id, mm.image_token_id, mm.vision_end_token_id] * num_images
        ids += rng.integers(0, min(_TEXT_IDS, engine.model_config.vocab_size), text_len).tolist()
        prompts.append(engine.process_prompt(
            {"prompt_token_ids": ids, "multi_modal_data": {"image": random_images(num_images, size, rng)}}))
    return prompts


def time_tower(engine: Engine, size: tuple[int, int], counts: tuple[int, ...], matmul_flops: float) -> list[dict]:
    """The tower alone on `count` images of `size` at once: its time and achieved FLOP rate."""
    runner = engine.executor.runner
    tower = runner.model.visual
    results = []
    for count in counts:
        prompt = image_prompts(engine, 1, count, size, 1, seed=1000 + count)[0]
        grids = [item.grid_thw for item in prompt.mm_items]
        pixels = normalise_pixels(prompt.mm_items, runner.device, runner.dtype)
        with torch.inference_mode():
            seconds = roofline._time_cuda(functools.partial(tower, pixels, grids), iters=5, warmup=2)
        flops = tower.flops(grids)
        results.append({"images": count, "image_size": list(size), "patches": int(pixels.shape[0]),
                        "visual_tokens": sum(item.num_tokens for item in prompt.mm_items),
                        "tower_s": seconds, "tower_flops": flops,
                        "tower_fraction_of_matmul": flops / seconds / matmul_flops})
    return results


def tower_flops(engine: Engine, prompts: list[ProcessedPrompt]) -> int:
    tower = engine.executor.runner.model.visual
    return sum(tower.flops([item.grid_thw]) for p in prompts for item in p.mm_items)


def run_hf_vision(model_dir: str, dtype: torch.dtype, prompt: ProcessedPrompt, output_len: int) -> dict:
    """HF transformers (eager, random weights, same config and GPU) on one image prompt: TTFT
    (one token, the tower included) and TPOT."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    cls = getattr(transformers, config.architectures[0])
    with torch.device("cuda"):
        model = cls._from_config(config, dtype=dtype).eval()
    ids = torch.tensor([prompt.prompt_token_ids], device="cuda")
    types = torch.zeros_like(ids)
    for item in prompt.mm_items:
        for off, n in item.spans:
            types[0, off:off + n] = 1
    inputs = dict(input_ids=ids, mm_token_type_ids=types,
                  pixel_values=normalise_pixels(prompt.mm_items, "cuda", dtype),
                  image_grid_thw=torch.tensor([i.grid_thw for i in prompt.mm_items], device="cuda"))
    out_len = min(output_len, 64)

    def generate(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    generate(2)
    ttft = generate(1)
    total = generate(out_len)
    return {"ttft_s": ttft, "tpot_s": (total - ttft) / (out_len - 1)}
