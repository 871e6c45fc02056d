"""`hotpath bench throughput`: offline throughput of a whole workload through LLM.generate, beside
its phases alone at their pure rates, measured in the same run.

The workload: N requests submitted at once, prompts and outputs of random lengths (uniform in the
given ranges, random token ids, ignore_eos) or ShareGPT conversations. The phases: prefill alone
(prompts of the workload's mean length, one output token each) and decode alone (a full batch of
max_num_seqs sequences at the workload's mean context). "Sum of phases" is the workload's prompt
tokens at the prefill rate plus its output tokens at the decode rate: what the mix would take if
mixing cost nothing. The engine is built with the user's defaults unless a flag says otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from hotpath.bench import roofline
from hotpath.bench.presets import PRESETS, preset_dir
from hotpath.args import EngineArgs
from hotpath.llm import LLM
from hotpath.sampling_params import SamplingParams


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def random_workload(n: int, input_range: tuple[int, int], output_range: tuple[int, int], vocab: int,
                    seed: int) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)]: lengths uniform in the ranges, ids uniform."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(*input_range))], rng.randint(*output_range))
            for _ in range(n)]


def sharegpt_workload(n: int, output_len: int, llm: LLM, max_len: int, seed: int) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)]: the requests `hotpath bench serve --dataset sharegpt`
    sends (first human turns as chat, sampled with `seed`), through the model's chat template;
    prompts too long for max_len with the output are cut from the front."""
    from hotpath.bench.datasets import load_requests

    out = []
    for req in load_requests("sharegpt", n, output_len, seed=seed):
        ids = llm.apply_chat_template(req.messages)
        out.append((ids[-(max_len - output_len):], output_len))
    return out


class StepKinds:
    """Counts the engine's steps by kind (graph decode, eager decode, mixed, prefill) by watching
    the runner's launches: where the time of a mixed workload goes."""

    def __init__(self, llm: LLM) -> None:
        self.counts: Counter[str] = Counter()
        runner = llm.engine.executor.runner
        launch = runner.launch

        def counting_launch(scheduled, *args, **kwargs):
            decodes = sum(1 for seq, n in scheduled if n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens)
            if decodes == len(scheduled):
                kind = "decode_graph" if runner._graph_size(scheduled) else "decode_eager"
            else:
                kind = "mixed" if decodes else "prefill"
            self.counts[kind] += 1
            self.counts[f"{kind}_rows"] += len(scheduled)
            return launch(scheduled, *args, **kwargs)

        runner.launch = counting_launch


def run(llm: LLM, work: list[tuple[list[int], int]]) -> dict:
    """Submits every request at once: elapsed seconds, token counts and rates."""
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in work]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert out_tokens == sum(m for _, m in work), "a request ended early"
    in_tokens = sum(len(p) for p, _ in work)
    return {"elapsed_s": elapsed, "prompt_tokens": in_tokens, "output_tokens": out_tokens,
            "output_tok_s": out_tokens / elapsed, "total_tok_s": (in_tokens + out_tokens) / elapsed}


def decode_rate(llm: LLM, batch: int, prompt_len: int, output_len: int, vocab: int) -> dict:
    """Pure decode of `batch` sequences: output tokens/s over the steps after every prefill."""
    engine = llm.engine
    rng = random.Random(1)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"decode-{i}-{time.monotonic_ns()}",
                           {"prompt_token_ids": [rng.randrange(vocab) for _ in range(prompt_len)]}, params)
    started: set[str] = set()
    t0 = tokens = None
    while engine.has_unfinished_requests():
        outs = engine.step()
        if t0 is None:
            started.update(o.request_id for o in outs)
            if len(started) == batch:
                t0, tokens = time.perf_counter(), 0
        else:
            tokens += len(outs)
    elapsed = time.perf_counter() - t0
    return {"tok_s": tokens / elapsed, "step_s": elapsed / (tokens / batch), "batch": batch,
            "prompt_len": prompt_len, "output_len": output_len}


def main(ns: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("hotpath bench throughput needs a CUDA GPU", file=sys.stderr)
        return 2
    model = str(preset_dir(ns.preset)) if ns.preset else ns.model
    if model is None:
        print("give --model or --preset", file=sys.stderr)
        return 2
    args = EngineArgs.from_cli_args(ns)
    args.model = model
    if ns.preset:
        args.load_format = "dummy"
    if ns.dataset == "random":
        args.skip_tokenizer_init = True
    say(f"building the engine ({args.load_format} weights, user defaults unless flags say otherwise)")
    llm = LLM(**vars(args))
    cfg, engine = llm.engine.model_config, llm.engine
    if ns.dataset == "random":
        work = random_workload(ns.num_prompts, ns.input_len_range, ns.output_len_range, cfg.vocab_size, ns.seed)
    else:
        work = sharegpt_workload(ns.num_prompts, ns.output_len, llm, engine.config.max_model_len, ns.seed)
    say("warm-up")
    run(llm, work[:64])
    kinds = StepKinds(llm)
    say(f"workload: {len(work)} requests at once")
    res = {"workload": run(llm, work), "steps": dict(kinds.counts)}
    mean_in = sum(len(p) for p, _ in work) / len(work)
    mean_out = sum(m for _, m in work) / len(work)
    if ns.phases:
        n = engine.config.max_num_seqs
        say(f"phase: prefill of {n} prompts of {round(mean_in)} tokens")
        pre = run(llm, random_workload(n, (round(mean_in),) * 2, (1, 1), cfg.vocab_size, ns.seed + 1))
        prefill_tok_s = pre["prompt_tokens"] / pre["elapsed_s"]
        say(f"phase: decode at batch {n}, context {round(mean_in)} + {round(mean_out)}")
        dec = decode_rate(llm, n, round(mean_in), round(mean_out), cfg.vocab_size)
        w = res["workload"]
        phases_s = w["prompt_tokens"] / prefill_tok_s + w["output_tokens"] / dec["tok_s"]
        model_ = roofline.engine_model(engine)
        bandwidth = roofline.measure_bandwidth(torch.device("cuda"))
        step_bytes = (roofline.decode_weight_bytes(model_, cfg, n)
                      + n * (mean_in + mean_out / 2)
                      * roofline.kv_bytes_per_token(cfg, getattr(torch, engine.executor.info.kv_cache_dtype)))
        res.update(prefill_tok_s=prefill_tok_s, decode=dec, sum_of_phases_s=phases_s,
                   workload_over_phases=w["elapsed_s"] / phases_s, bandwidth_Bps=bandwidth,
                   decode_roofline_step_s=step_bytes / bandwidth,
                   decode_over_roofline=dec["step_s"] / (step_bytes / bandwidth))
    res.update(name=ns.preset or ns.model, dataset=ns.dataset, num_prompts=len(work),
               max_num_seqs=engine.config.max_num_seqs,
               max_num_batched_tokens=engine.config.max_num_batched_tokens,
               max_model_len=engine.config.max_model_len, device=torch.cuda.get_device_name(),
               date=time.strftime("%Y-%m-%d"))
    _print(res)
    if ns.json:
        Path(ns.json).write_text(json.dumps(res, indent=2))
    return 0


def _print(r: dict) -> None:
    w = r["workload"]
    print(f"workload      {r['num_prompts']} requests, {w['prompt_tokens']} prompt + {w['output_tokens']} "
          f"output tokens in {w['elapsed_s']:.1f} s: {w['output_tok_s']:.0f} output tok/s, "
          f"{w['total_tok_s']:.0f} total tok/s")
    print(f"steps         {r['steps']}")
    if "sum_of_phases_s" in r:
        d = r["decode"]
        print(f"prefill alone {r['prefill_tok_s']:.0f} tok/s")
        print(f"decode alone  {d['tok_s']:.0f} tok/s at batch {d['batch']} ({d['step_s'] * 1e3:.1f} ms a step, "
              f"{r['decode_over_roofline']:.2f}x its roofline {r['decode_roofline_step_s'] * 1e3:.1f} ms)")
        print(f"sum of phases {r['sum_of_phases_s']:.1f} s; workload / phases = {r['workload_over_phases']:.2f}")


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX with 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def add_parser(sub) -> None:
    p = sub.add_parser("throughput", help="offline throughput of a request mix, beside its phases alone")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a published model shape with random weights (implies --load-format dummy)")
    p.add_argument("--dataset", choices=["random", "sharegpt"], default="random",
                   help="random token prompts, or ShareGPT conversations (needs the model's tokenizer)")
    p.add_argument("--num-prompts", type=int, default=1024, help="requests, all submitted at once")
    p.add_argument("--input-len-range", type=_range, default=(128, 1024), help="random: prompt tokens MIN,MAX")
    p.add_argument("--output-len-range", type=_range, default=(128, 512), help="random: output tokens MIN,MAX")
    p.add_argument("--output-len", type=int, default=256, help="sharegpt: output tokens per request")
    p.add_argument("--phases", action=argparse.BooleanOptionalAction, default=True,
                   help="also time prefill alone and decode alone, for the sum-of-phases ratio")
    p.add_argument("--json", default=None, help="write the figures to this JSON file")
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=main)
