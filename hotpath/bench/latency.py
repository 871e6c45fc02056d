"""`hotpath bench latency`: TTFT and TPOT of one batch, against the HBM roofline measured in the
same run, and optionally against HF transformers on the same config and GPU.

The engine is built from the engine flags, so by default it is the engine a user gets (max_model_len
the model's, the KV cache from gpu_memory_utilization, max_num_seqs 256, prefix caching, the 8192
token budget that prefills longer prompts in chunks): the path timed is the path served. Flags size
it to the batch instead (--max-model-len, --num-gpu-blocks-override, --max-num-seqs, ...)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from hotpath.bench import roofline, vision
from hotpath.bench.presets import PRESETS, preset_dir
from hotpath.args import EngineArgs
from hotpath.engine.engine import Engine
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.sampling_params import SamplingParams


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _run_batch(engine: Engine, prompts: list[list[int] | ProcessedPrompt], output_len: int) -> tuple[float, list[float]]:
    """Returns (TTFT, decode step times) for one batch run to completion."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}",
                           {"prompt_token_ids": p} if isinstance(p, list) else p, params)
    ttft = None
    started: set[str] = set()
    step_times = []
    last = start
    while engine.has_unfinished_requests():
        # a step that returns tokens has waited for them on the host: a real sync point. Under
        # async scheduling a call may only launch a step and return none (its tokens come with the
        # next call), so intervals run from one step with tokens to the next: one token each
        outs = engine.step()
        if not outs:
            continue
        now = time.perf_counter()
        if ttft is None:
            started.update(o.request_id for o in outs)
            if len(started) == len(prompts):  # every prompt has its first token
                ttft = now - start
        else:
            step_times.append(now - last)
        last = now
    return ttft, step_times


def engine_args(ns: argparse.Namespace, model_dir: str) -> EngineArgs:
    """The engine the bench times: the engine flags as given, each one absent at LLM()'s default.
    Prompts are token ids, so no tokenizer is loaded."""
    return replace(EngineArgs.from_cli_args(ns), model=model_dir, skip_tokenizer_init=True)


def run_hotpath(ns: argparse.Namespace, model_dir: str, matmul: float) -> tuple[list[dict], list[dict]]:
    """One engine, each batch size of --batch-size timed in turn; with --images, the vision tower
    alone on one and on eight images too. Keeps one image prompt for --compare hf."""
    say(f"loading hotpath engine ({ns.load_format} weights) and capturing CUDA graphs")
    engine = Engine(engine_args(ns, model_dir))
    if engine.config.max_model_len < ns.input_len + ns.output_len:
        raise ValueError(f"max_model_len {engine.config.max_model_len} is shorter than --input-len + "
                         f"--output-len ({ns.input_len + ns.output_len})")
    results = [_time_batch(engine, ns, bs) for bs in ns.batch_size]
    towers = []
    if ns.images:
        say("the vision tower alone: 1 and 8 images")
        towers = vision.time_tower(engine, vision.parse_size(ns.image_size), (1, 8), matmul)
        ns.hf_prompt = vision.image_prompts(engine, 1, ns.images, vision.parse_size(ns.image_size),
                                            ns.input_len, seed=7)[0]
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return results, towers


def _time_batch(engine: Engine, ns: argparse.Namespace, batch_size: int) -> dict:
    cfg = engine.model_config
    g = torch.Generator().manual_seed(batch_size)
    # the warm-up's prompts are not the timed run's: with prefix caching (the default) the timed
    # run would find its prompts cached and skip their prefill
    warm_up, prompts = [[torch.randint(0, cfg.vocab_size, (ns.input_len,), generator=g).tolist()
                         for _ in range(batch_size)] for _ in range(2)]
    extra = {}
    prompt_len = ns.input_len
    if ns.images:  # the same text after fresh images each run (the encoder cache serves none)
        size = vision.parse_size(ns.image_size)
        warm_up, prompts = [vision.image_prompts(engine, batch_size, ns.images, size, ns.input_len, seed)
                            for seed in (2 * batch_size, 2 * batch_size + 1)]
        prompt_len = len(prompts[0].prompt_token_ids)
        say(f"text-only run of the same length ({prompt_len} tokens), for the TPOT beside the images'")
        text = [[torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(batch_size)]
                for _ in range(2)]
        _run_batch(engine, text[0], 8)
        _, text_steps = _run_batch(engine, text[1], ns.output_len)
        extra.update(images_per_prompt=ns.images, image_size=ns.image_size, prompt_len=prompt_len,
                     visual_tokens_per_prompt=sum(i.num_tokens for i in prompts[0].mm_items),
                     tower_flops=vision.tower_flops(engine, prompts),
                     text_only_tpot_s=sum(text_steps) / (ns.output_len - 1))
    say(f"warm-up run: batch {batch_size}")
    _run_batch(engine, warm_up, min(ns.output_len, 8))
    say(f"timed run: batch {batch_size}, {prompt_len} prompt tokens, {ns.output_len} output tokens")
    spec = engine.spec_stats
    before = (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens)
    ttft, steps = _run_batch(engine, prompts, ns.output_len)
    # every request emits output_len tokens; a step may emit several (speculative decoding)
    tpot = sum(steps) / (ns.output_len - 1) if steps else float("nan")
    per_step = (ns.output_len - 1) / len(steps) if steps else float("nan")
    model = roofline.engine_model(engine)
    mean_ctx = prompt_len + ns.output_len / 2
    if engine.spec_config is not None:
        rows, drafted, accepted = (now - was for now, was in zip(
            (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens), before))
        # rows: a sequence's drafts verified in one step (a step of batch B verifies up to B)
        extra = {"spec_verify_rows": rows, "spec_draft_tokens": drafted, "spec_accepted_tokens": accepted,
                 "spec_step_time_s": {f"bs{b}-k{k}": t for (b, k), t in sorted(engine.speculation.policy.step_time.items())}}
    return {
        "batch_size": batch_size,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "tpot_median_s": sorted(steps)[len(steps) // 2] / per_step if steps else float("nan"),
        "tokens_per_step": per_step,
        **extra,
        "output_tokens_per_s": batch_size / tpot,
        "weight_bytes_per_step": roofline.decode_weight_bytes(model, cfg, batch_size),
        # the KV cache read, and a hybrid's linear-attention state read and written
        "kv_bytes_per_step": int(batch_size * mean_ctx
                                 * roofline.kv_bytes_per_token(cfg, getattr(torch, engine.executor.info.kv_cache_dtype)))
        + 2 * batch_size * roofline.state_bytes_per_sequence(cfg, engine.dtype),
        # the vision tower's too, where the prompts carry images
        "prefill_flops": roofline.prefill_flops(cfg, roofline.active_params(model, cfg), prompt_len) * batch_size
        + extra.get("tower_flops", 0),
        "kv_cache_tokens": engine.executor.info.num_blocks * engine.config.block_size,
        "max_model_len": engine.config.max_model_len,
    }


def run_hf(ns: argparse.Namespace, model_dir: str, dtype: torch.dtype, batch_size: int) -> dict:
    """HF transformers, eager, same config and GPU, random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    say("building the HF transformers model on the same config")
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    ids = torch.randint(0, config.vocab_size, (batch_size, ns.input_len), device="cuda")
    out_len = min(ns.output_len, 64)  # TPOT does not need the full length at HF's speed

    def generate(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    say("HF warm-up")
    generate(2)
    ttft = generate(1)
    total = generate(out_len)
    model = None  # free the HF model before hotpath's next allocation
    gc.collect()
    torch.cuda.empty_cache()
    return {"ttft_s": ttft, "tpot_s": (total - ttft) / (out_len - 1)}


def main(ns: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("hotpath bench latency needs a CUDA GPU", file=sys.stderr)
        return 2
    if ns.preset:
        model_dir = str(preset_dir(ns.preset))
        ns.load_format = "dummy"
    elif ns.model:
        model_dir = ns.model
    else:
        print("give --model or --preset", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    say("measuring HBM bandwidth (device-to-device copy) and the bf16 matmul rate")
    bandwidth = roofline.measure_bandwidth(device)
    matmul = roofline.measure_matmul_flops(device)
    runs, towers = run_hotpath(ns, model_dir, matmul)
    for res in runs:
        roof = (res["weight_bytes_per_step"] + res["kv_bytes_per_step"]) / bandwidth
        res.update(
            name=ns.preset or ns.model, input_len=ns.input_len, output_len=ns.output_len,
            device=torch.cuda.get_device_name(), bandwidth_Bps=bandwidth, matmul_flops=matmul,
            roofline_tpot_s=roof, tpot_over_roofline=res["tpot_s"] / roof,
            prefill_tflops=res["prefill_flops"] / res["ttft_s"] / 1e12,
            prefill_fraction_of_matmul=res["prefill_flops"] / res["ttft_s"] / matmul,
            date=time.strftime("%Y-%m-%d"),
        )
    if ns.compare == "hf":  # at the first batch size
        dtype = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float32": torch.float32}[ns.dtype]
        res = runs[0]
        if ns.images:
            hf = vision.run_hf_vision(model_dir, dtype, ns.hf_prompt, ns.output_len)
        else:
            hf = run_hf(ns, model_dir, dtype, res["batch_size"])
        res["hf_ttft_s"] = hf["ttft_s"]
        res["hf_tpot_s"] = hf["tpot_s"]
        res["hf_tpot_over_roofline"] = hf["tpot_s"] / res["roofline_tpot_s"]
    for res in runs:
        _print_table(res)
    for t in towers:
        print(f"vision tower, {t['images']} image(s) of {t['image_size'][0]}x{t['image_size'][1]}: "
              f"{t['tower_s'] * 1e3:.2f} ms, {t['tower_fraction_of_matmul']:.2f} of matmul")
    if ns.json:
        out = runs[0] if len(runs) == 1 else runs
        if towers:
            out = {"runs": runs, "vision_tower": towers}
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


def _print_table(r: dict) -> None:
    rows = [
        ("model", r["name"]),
        ("batch / input / output", f"{r['batch_size']} / {r['input_len']} / {r['output_len']}"),
        ("HBM bandwidth (copy)", f"{r['bandwidth_Bps'] / 1e12:.2f} TB/s"),
        ("bytes per decode step", f"{(r['weight_bytes_per_step'] + r['kv_bytes_per_step']) / 1e9:.2f} GB"),
        ("roofline TPOT", f"{r['roofline_tpot_s'] * 1e3:.3f} ms"),
        ("TTFT", f"{r['ttft_s'] * 1e3:.2f} ms ({r['prefill_tflops']:.0f} TFLOP/s, "
                 f"{r['prefill_fraction_of_matmul']:.2f} of matmul {r['matmul_flops'] / 1e12:.0f})"),
        ("TPOT", f"{r['tpot_s'] * 1e3:.3f} ms = {r['tpot_over_roofline']:.2f}x roofline"),
    ]
    if "text_only_tpot_s" in r:
        rows += [("images / visual tokens", f"{r['images_per_prompt']} of {r['image_size']} / "
                                            f"{r['visual_tokens_per_prompt']} a prompt"),
                 ("text-only TPOT (same length)", f"{r['text_only_tpot_s'] * 1e3:.3f} ms")]
    rows += [
        ("output tokens/s", f"{r['output_tokens_per_s']:.1f}"),
    ]
    if "hf_tpot_s" in r:
        rows += [("HF TTFT", f"{r['hf_ttft_s'] * 1e3:.2f} ms"),
                 ("HF TPOT", f"{r['hf_tpot_s'] * 1e3:.3f} ms = {r['hf_tpot_over_roofline']:.2f}x roofline")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def add_parser(sub) -> None:
    p = sub.add_parser("latency", help="time one batch: TTFT, TPOT and the HBM roofline")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a published model shape with random weights (implies --load-format dummy)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1],
                   help="sequences decoded together; several sizes are timed in turn on one engine")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens per sequence")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per sequence")
    p.add_argument("--compare", choices=["hf"], default=None,
                   help="also time HF transformers (eager) on the same config in this process, at the "
                        "first batch size")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    p.add_argument("--images", type=int, default=0,
                   help="image-text models: images at the start of each prompt (random pixels, "
                        "preprocessed before the clock starts); also times the vision tower alone and "
                        "a text-only batch of the same length")
    p.add_argument("--image-size", default="1280x1280", help="WIDTHxHEIGHT of each --images image")
    # the engine flags, at LLM()'s defaults: --model (an HF directory for --compare hf),
    # --max-model-len, --num-gpu-blocks-override, --max-num-seqs, --enforce-eager, ...
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=main)
