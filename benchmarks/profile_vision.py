"""Where an image prompt's time goes on an image-text model (LLM(model) at defaults, random weights
at the preset's shape): the tower alone kernel by kernel, the whole first token (tower + prefill +
host work) kernel by kernel with the host ops beside, the tower's attention against torch's SDPA
backends and a sweep of the Triton kernel's tiles, and the MLP's fc1 + GELU fused in cuBLASLt's
epilogue against the two launches.

    python benchmarks/profile_vision.py --preset qwen3-vl-8b --image-size 1280x1280 --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from hotpath import LLM, SamplingParams
from hotpath.bench.presets import preset_dir
from hotpath.bench.roofline import _time_cuda as timed
from hotpath.bench.roofline import measure_matmul_flops
from hotpath.bench.vision import image_prompts, parse_size
from hotpath.multimodal.inputs import normalise_pixels


def table(prof, device: bool = True, top: int = 25) -> list[dict]:
    key = "device_time_total" if device else "self_cpu_time_total"
    rows = sorted(((e.key, e.count, getattr(e, key) / 1e3) for e in prof.key_averages()), key=lambda r: -r[2])
    return [{"name": n[:100], "count": c, "ms": round(ms, 3)} for n, c, ms in rows[:top] if ms > 0]


def show(title: str, rows: list[dict]) -> None:
    print(f"--- {title}")
    for r in rows:
        print(f"{r['ms']:9.3f} ms {r['count']:6d}  {r['name']}")


def attention_sweep(images: int, tokens: int, heads: int, dim: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hotpath.ops.vision_attention import triton as kernels

    scale = dim**-0.5
    q, k, v = (torch.randn(images * tokens, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, images + 1, device="cuda", dtype=torch.int32) * tokens
    flops = images * 4 * tokens * tokens * heads * dim
    row: dict = {"images": images, "tokens": tokens, "heads": heads, "head_dim": dim}
    row["triton_default_ms"] = timed(functools.partial(kernels.varlen_attention, q, k, v, cu, tokens, scale)) * 1e3
    for bm, bn, w, s in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                         (128, 64, 4, 4), (128, 64, 8, 2), (256, 64, 8, 3)]:
        try:
            row[f"triton_{bm}x{bn}_w{w}_s{s}_ms"] = timed(functools.partial(
                kernels.varlen_attention, q, k, v, cu, tokens, scale, config=(bm, bn, w, s))) * 1e3
        except Exception as e:  # out of shared memory / registers
            row[f"triton_{bm}x{bn}_w{w}_s{s}_error"] = str(e).splitlines()[0][:120]
    qb, kb, vb = (x.view(images, tokens, heads, dim).transpose(1, 2) for x in (q, k, v))  # [B, H, L, D]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
        try:
            row[f"sdpa_{name}_ms"] = timed(run) * 1e3
        except RuntimeError as e:
            row[f"sdpa_{name}_error"] = str(e).splitlines()[0][:160]
    for key in [k for k in row if k.endswith("_ms")]:
        row[key.removesuffix("_ms") + "_tflops"] = round(flops / (row[key] / 1e3) / 1e12, 1)
    return row


def gelu_epilogue(tokens: int, hidden: int, inter: int) -> dict:
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
    b = torch.randn(inter, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5
    ln = torch.nn.LayerNorm(hidden, device="cuda", dtype=torch.bfloat16)
    plain = timed(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
    fused = timed(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
    same = (F.gelu(F.linear(x, w, b), approximate="tanh") - torch._addmm_activation(b, x, w.t(), use_gelu=True))
    return {"fc1_gelu_two_launches_ms": plain * 1e3, "fc1_gelu_epilogue_ms": fused * 1e3,
            "fc1_alone_ms": timed(lambda: F.linear(x, w, b)) * 1e3,
            "fc2_ms": timed(lambda: F.linear(torch.empty(tokens, inter, device="cuda", dtype=torch.bfloat16), w2)) * 1e3,
            "layernorm_ms": timed(lambda: ln(x)) * 1e3,
            "max_abs_diff": same.abs().max().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-vl-8b")
    ap.add_argument("--image-size", default="1280x1280")
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--out", default=".")
    ns = ap.parse_args()
    size = parse_size(ns.image_size)
    res: dict = {"preset": ns.preset, "image_size": ns.image_size, "device": torch.cuda.get_device_name()}
    res["matmul_tflops"] = measure_matmul_flops(torch.device("cuda")) / 1e12

    llm = LLM(str(preset_dir(ns.preset)), load_format="dummy", skip_tokenizer_init=True)
    engine = llm.engine
    runner = engine.executor.runner
    tower = runner.model.visual
    cfg = tower.config

    # the tower alone, one image
    prompt = image_prompts(engine, 1, 1, size, 1, seed=1)[0]
    grids = [item.grid_thw for item in prompt.mm_items]
    pixels = normalise_pixels(prompt.mm_items, "cuda", runner.dtype)
    with torch.inference_mode():
        tower_s = timed(functools.partial(tower, pixels, grids), iters=5, warmup=2)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            tower(pixels, grids)
            torch.cuda.synchronize()
    res["tower_ms"] = tower_s * 1e3
    res["tower_fraction_of_matmul"] = tower.flops(grids) / tower_s / (res["matmul_tflops"] * 1e12)
    res["tower_kernels"] = table(prof)
    show(f"tower alone, 1 image: {tower_s * 1e3:.2f} ms = {res['tower_fraction_of_matmul']:.3f} of matmul",
         res["tower_kernels"])

    # the first token of an image prompt, through generate
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    mm = engine.model_config.multimodal
    rng = np.random.default_rng(0)

    def request() -> dict:
        ids = [mm.vision_start_token_id, mm.image_token_id, mm.vision_end_token_id]
        ids += rng.integers(10, 150000, ns.input_len).tolist()
        return {"prompt_token_ids": ids,
                "multi_modal_data": {"image": [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)]}}

    for _ in range(2):
        llm.generate([request()], params, use_tqdm=False)
    walls = []
    for _ in range(3):
        r = request()
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate([r], params, use_tqdm=False)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    res["generate_wall_ms"] = walls  # includes preprocessing on the host
    # the engine step alone: prompts processed first, as the bench does
    processed = image_prompts(engine, 1, 1, size, ns.input_len, seed=7)
    step_walls = []
    for seed in range(3):
        processed = image_prompts(engine, 1, 1, size, ns.input_len, seed=100 + seed)
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(processed, params, use_tqdm=False)
        torch.cuda.synchronize()
        step_walls.append((time.perf_counter() - t) * 1e3)
    res["processed_generate_wall_ms"] = step_walls
    processed = image_prompts(engine, 1, 1, size, ns.input_len, seed=99)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(processed, params, use_tqdm=False)
        torch.cuda.synchronize()
    res["ttft_kernels"] = table(prof, top=40)
    res["ttft_host_ops"] = table(prof, device=False, top=25)
    print(f"generate wall (with preprocessing): {walls}; processed prompts: {step_walls}")
    show("first token of an image prompt, GPU", res["ttft_kernels"])
    show("first token of an image prompt, host self time", res["ttft_host_ops"])

    patches = size[0] * size[1] // cfg.patch_size**2
    res["attention"] = [attention_sweep(n, patches, cfg.num_heads, cfg.head_dim) for n in (1, 8)]
    res["gelu_epilogue"] = gelu_epilogue(patches, cfg.hidden_size, cfg.intermediate_size)
    print(json.dumps(res["attention"], indent=1))
    print(json.dumps(res["gelu_epilogue"], indent=1))
    Path(ns.out).mkdir(parents=True, exist_ok=True)
    (Path(ns.out) / f"vision_profile_{ns.preset}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
