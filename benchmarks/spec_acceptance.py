"""Speculative decoding's acceptance on real models (issue 22, item 2).

Target: Qwen2.5-Coder-1.5B-Instruct ("qwen2.5-coder-1.5b"), greedy (temperature 0), prompts
chat-templated with the model's template (LLM.apply_chat_template, as hotpath/bench does for
chat prompt sets). Two drafters:

  draft model   Qwen2.5-Coder-0.5B-Instruct ("qwen2.5-coder-0.5b"), k = 8, on
                humaneval: each HumanEval prompt in a chat turn ("Complete the following Python
                           function. Reply with only the code." + the prompt in a code fence)
                mtbench:   MT-Bench first turns (hotpath.bench.datasets.load_requests)
  n-gram        prompt lookup (prompt_lookup_min 2, max 5), k = 4 and 8, on
                edit:      a code-editing turn that contains the code to rewrite: "Rewrite this
                           function so that every variable has a descriptive name, keeping its
                           behaviour; reply with only the code:" + HumanEval prompt +
                           canonical_solution in a code fence

The commands behind docs/bench/spec_acceptance_*.json (CPU, fp32, one torch thread on 2 cores
shared with other work; each run writes its JSON and prints a table per workload):

    nice -n 10 python benchmarks/spec_acceptance.py --workloads humaneval,mtbench --prompts 10,6 \\
        --max-tokens 128 --check-k 2 --check-prompts 2 --out docs/bench/spec_acceptance_draft_model.json
    nice -n 10 python benchmarks/spec_acceptance.py --workloads edit --method ngram --ks 4,8 \\
        --prompts 10 --max-tokens 256 --out docs/bench/spec_acceptance_ngram_edit.json

k is fixed ("adaptive": false in the speculative config; the engine's default policy picks each
step's number of drafts from measured step times, which on the CPU mostly cut it to 3, so the
positions past 3 were hardly drafted). The workloads of one command run together, in one batch;
the figures are per workload, from the step log below.

Each run first generates every prompt without speculation (the reference), then with it, and
checks the greedy outputs are equal token for token (--equality-prompts N limits the check, and
the reference run, to the first N prompts; the JSON says how many were checked). A difference is
written to the JSON (prompt, first differing position, both tokens) and the script exits 1.

What is measured, from the engine's counters (llm.engine.spec_stats) and from a log of every
step (the drafter's propose() and the policy's record_acceptance() wrapped): each step's drafts,
accepted as far as they agree with the final output (the drafts that reached the output, what
the engine's counters count since 8c48ada; their sums are checked against the counters). The
verify step's own count (len(verified tokens) - 1, what the policy sees) also takes the drafts
after an accepted stop token that the target predicted too: "accepted_per_pos_incl_past_stop",
and "steps_counted_past_a_stop" says how many steps differ:
  - rate[i]: accepted_per_pos[i] / drafted_per_pos[i], the acceptance at draft position i among
    verify steps that drafted one there (it includes the rejections before it);
  - cond[i]: P(draft i accepted | drafts 1..i-1 accepted, draft i proposed), from the step log;
  - mean accepted length: tokens a verify step emitted, 1 + accepted / verify steps; and
    tokens per decode step, counting decode steps that had no drafts (n-gram misses);
  - E_iid[k] = 1 + sum_{i<=k} P(first i drafts all accepted), P = prod of cond[1..i]: the
    expected tokens per verify step at k from the k = 8 run's per-position figures.

Greedy acceptance at position i does not depend on k in this sense: from a given point of the
output, the drafts (the drafter's greedy continuation) and the target's tokens are the same
whatever k is, so a step starting there accepts min(k, L) drafts, where L is the length of the
drafts' agreement with the output. A run at k = 8 therefore measures positions 1..8. The steps
start at different points for different k (after a rejection, or after k accepted), so the
counts of a k = 2 run are not the k = 8 run's first two columns, only estimates of the same
rates. The script checks the exact statement and also replays every k exactly:
  - replay: the per-token agreement map of the output (n-gram: ngram_propose on the context at
    every position, no model; draft model: the draft model's argmax at every output position,
    teacher forced in one forward per prompt over prompt + output through the engine's own
    draft model, cross-checked against the drafts it proposed during the run) gives the step
    sequence any k would take: the steps, per-position counts and tokens per decode step for
    k = 1..8 (E_replay[k]); the replayed counts at the measured k must equal the measured ones;
  - --check-k K (draft model): a real run at k = K on the first --check-prompts prompts, whose
    per-step accepted counts and per-position counts are compared with the replay at k = K.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import gzip
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from hotpath import LLM, SamplingParams
from hotpath.bench.datasets import fetch_dataset, load_requests
from hotpath.speculative.ngram import ngram_propose
from hotpath.layers.forward_batch import ForwardBatch

TARGET = "qwen2.5-coder-1.5b"
DRAFT = "qwen2.5-coder-0.5b"
TARGET_HF = "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantized)"
DRAFT_HF = "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized)"
MAX_K = 8  # the replay and E[tokens | k] tables go to this k
HUMANEVAL_TURN = "Complete the following Python function. Reply with only the code.\n```python\n{code}```"
EDIT_TURN = ("Rewrite this function so that every variable has a descriptive name, keeping its "
             "behaviour; reply with only the code:\n```python\n{code}```")


# ---- prompts ---------------------------------------------------------------------------------
def humaneval_records(seed: int) -> list[dict]:
    """HumanEval's records in the order load_requests("humaneval", seed=seed) samples them."""
    with gzip.open(fetch_dataset("humaneval"), "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    random.Random(seed).shuffle(records)
    return records


def build_conversations(workload: str, n: int, seed: int) -> list[tuple[str, list[dict]]]:
    """(id, chat messages) for the first n prompts of the workload."""
    if workload == "mtbench":
        reqs = load_requests("mtbench", n, 1, seed=seed)
        return [(f"mtbench[{i}]", r.messages) for i, r in enumerate(reqs)]
    records = humaneval_records(seed)[:n]
    if workload == "humaneval":
        return [(r["task_id"], [{"role": "user", "content": HUMANEVAL_TURN.format(code=r["prompt"])}])
                for r in records]
    return [(r["task_id"], [{"role": "user", "content": EDIT_TURN.format(code=r["prompt"] + r["canonical_solution"])}])
            for r in records]


# ---- engine runs -----------------------------------------------------------------------------
def make_llm(args: argparse.Namespace, spec: dict | None, num_seqs: int) -> LLM:
    return LLM(TARGET, max_model_len=args.max_model_len, max_num_seqs=max(1, num_seqs),
               speculative_config=spec)


def spec_config(method: str, k: int) -> dict:
    if method == "draft_model":
        return {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": k, "adaptive": False}
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
            "adaptive": False}


def log_steps(llm: LLM):
    """Wraps the engine's drafter and its draft-length policy: every proposal as (request_id,
    output tokens so far, slots, drafts), every verify row as the engine counted it (request_id,
    output tokens before it, drafts, accepted)."""
    proposals: list[tuple[str, int, int, list[int]]] = []
    verified: dict[tuple[str, int], tuple[int, int]] = {}
    drafter = llm.engine.drafter
    propose = drafter.propose

    def logged(seqs, slots):
        propose(seqs, slots)
        for seq, k in zip(seqs, slots):
            proposals.append((seq.request_id, seq.num_output_tokens, k, list(seq.draft_token_ids)))

    drafter.propose = logged
    policy = getattr(llm.engine, "spec_policy", None)
    if policy is not None:
        record = policy.record_acceptance

        def record_logged(seq, drafts, accepted):
            verified[(seq.request_id, seq.num_output_tokens)] = (drafts, accepted)
            record(seq, drafts, accepted)

        policy.record_acceptance = record_logged
    return proposals, verified


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=True)
    return outs, time.perf_counter() - t0


# ---- step statistics -------------------------------------------------------------------------
def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def step_stats(steps: list[tuple[int, int]], k: int) -> dict:
    """Per-position figures of verify steps given as (drafts, accepted); steps without drafts are
    left out (they are plain decode steps)."""
    steps = [(d, a) for d, a in steps if d > 0]
    drafted = [sum(d > i for d, _ in steps) for i in range(k)]
    accepted = [sum(a > i for _, a in steps) for i in range(k)]
    # cond[i]: of the steps that drafted position i and accepted every draft before it, how many
    # accepted position i too
    reached = [sum(d > i and a >= i for d, a in steps) for i in range(k)]
    cond = [accepted_i / r if r else None for accepted_i, r in zip(
        [sum(d > i and a > i for d, a in steps) for i in range(k)], reached)]
    rate = [a / d if d else None for a, d in zip(accepted, drafted)]
    num = len(steps)
    total_acc = sum(a for _, a in steps)
    e_iid, p, e = [], 1.0, 1.0
    for c in cond:
        p *= c if c is not None else 0.0
        e += p
        e_iid.append(e)
    return {
        "num_verify_steps": num,
        "num_draft_tokens": sum(d for d, _ in steps),
        "num_accepted_tokens": total_acc,
        "drafted_per_pos": drafted,
        "accepted_per_pos": accepted,
        "acceptance_rate_per_pos": rate,
        "conditional_rate_per_pos": cond,
        "acceptance_rate": total_acc / sum(d for d, _ in steps) if steps else None,
        "mean_accepted_length": 1 + total_acc / num if num else None,  # tokens per verify step
        "E_tokens_per_step_iid": e_iid,  # E[tokens | k'] for k' = 1..k from cond
    }


def measured_steps(log, request_index: dict[str, int], outputs: list[list[int]]):
    """Per request, the steps that had draft slots as (t, slots, drafts, accepted, prefix):
    accepted as the verify step counted it (len(verified tokens) - 1), prefix the drafts' common
    prefix with the final output. They differ only where a stop token was accepted before the
    last accepted draft: the engine counts the drafts after it that the target also predicted,
    the output ends at the stop."""
    proposals, verified = log
    per_req: list[list[tuple[int, int, list[int], int, int]]] = [[] for _ in outputs]
    for rid, t, slots, drafts in proposals:
        i = request_index[rid]
        prefix = common_prefix(drafts, outputs[i][t:])
        d, accepted = verified.get((rid, t), (0, 0))
        assert d == len(drafts), (rid, t, d, drafts)
        per_req[i].append((t, slots, drafts, accepted, prefix))
    return per_req


def count_decode_steps(steps, out: list[int]) -> int:
    """The decode steps a request took (after its prefill), from its logged steps: each emitted its
    agreeing drafts and one token more; steps without draft slots (t = max_tokens - 1) are not
    logged and emit one token. Checks the logged steps start where the previous one ended."""
    t, n = 1, 0
    for st in sorted(steps):
        while t < st[0]:  # a step without slots
            t, n = t + 1, n + 1
        assert t == st[0], (t, st[:2])
        t, n = t + st[4] + 1, n + 1
    while t < len(out):
        t, n = t + 1, n + 1
    return n


# ---- replay: the steps any k takes, from the output's agreement map ----------------------------
def replay(out: list[int], max_tokens: int, k: int, drafts_at) -> list[tuple[int, int, int, int]]:
    """The decode steps of a greedy run at k whose output is `out`: (t, slots, drafts, accepted). The
    first token comes from the prefill; then each step at output position t proposes
    drafts_at(t, slots) and emits its accepted drafts and one token more."""
    steps, t = [], 1
    while t < len(out):
        slots = max(0, min(k, max_tokens - t - 1))
        drafts = drafts_at(t, slots) if slots else []
        a = common_prefix(drafts, out[t:])
        steps.append((t, slots, len(drafts), a))
        t += a + 1
    return steps


def ngram_drafts_at(prompt: list[int], out: list[int], lo: int, hi: int):
    def at(t: int, slots: int) -> list[int]:
        return ngram_propose(prompt + out[:t], slots, lo, hi)
    return at


def argmax_drafts_at(out: list[int], argmax: list[int]):
    """Draft-model drafts from its teacher-forced argmax: argmax[s] is its greedy token given the
    prompt and out[:s]. Drafts after the first that disagrees with the output are conditioned on
    a token the output does not have, unknown here; they never count (-1)."""
    def at(t: int, slots: int) -> list[int]:
        drafts = []
        for s in range(t, t + slots):
            if s >= len(out):
                break
            drafts.append(argmax[s])
            if argmax[s] != out[s]:
                break
        return drafts + [-1] * (slots - len(drafts))
    return at


def replay_table(per_req_steps: list[list[tuple[int, int, int, int]]], outputs: list[list[int]], k: int) -> dict:
    flat = [(d, a) for steps in per_req_steps for _, _, d, a in steps]
    stats = step_stats(flat, k)
    decode_steps = sum(len(s) for s in per_req_steps)
    emitted = sum(len(o) - 1 for o in outputs)
    stats["decode_steps"] = decode_steps
    stats["tokens_per_decode_step"] = emitted / decode_steps if decode_steps else None
    return stats


@torch.inference_mode()
def draft_argmax(llm: LLM, prompt: list[int], out: list[int]) -> list[int]:
    """The draft model's argmax at every output position, teacher forced: argmax[s] given prompt
    + out[:s] (s >= 1; argmax[0] is -1). One prefill forward over the engine's draft model, whose
    K/V go into the cache's first blocks: call it only once the engine is done generating (the
    draft K/V of cached prefixes are overwritten)."""
    engine = llm.engine
    runner = engine.executor.runner
    assert not engine.requests, "draft_argmax() needs an idle engine"
    ids_list = prompt + out
    n, p, device = len(ids_list), len(prompt), runner.device
    num_blocks = -(-n // runner.block_size)
    assert num_blocks <= runner.num_blocks
    batch = ForwardBatch(
        cu_query_lens=torch.tensor([0, n], dtype=torch.int32, device=device),
        context_lens=torch.tensor([n], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        slot_mapping=torch.arange(n, dtype=torch.int64, device=device),
        logits_indices=torch.arange(p, n - 1, device=device),  # predicts out[1:]
        max_query_len=n,
        max_context_len=n,
    )
    ids = torch.tensor(ids_list, dtype=torch.int64, device=device)
    model = runner.draft_model
    hidden = model(ids, torch.arange(n, device=device), batch)
    logits = model.compute_logits(hidden[batch.logits_indices])[:, : runner.model_config.vocab_size]
    return [-1] + logits.argmax(-1).tolist()


# ---- equality --------------------------------------------------------------------------------
def compare(ids: list[str], reference: list[list[int]], outputs: list[list[int]], tokenizer) -> list[dict]:
    diffs = []
    for pid, ref, out in zip(ids, reference, outputs):
        if ref == out:
            continue
        i = common_prefix(ref, out)
        diffs.append({
            "prompt": pid, "first_diff": i, "len_reference": len(ref), "len_spec": len(out),
            "reference_token": ref[i] if i < len(ref) else None, "spec_token": out[i] if i < len(out) else None,
            "context": tokenizer.decode(ref[max(0, i - 20):i]) if tokenizer else None,
        })
    return diffs


# ---- printing --------------------------------------------------------------------------------
def fmt(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def print_table(title: str, stats: dict, extra: dict | None = None) -> None:
    k = len(stats["drafted_per_pos"])
    print(f"\n{title}")
    print("  pos      " + " ".join(f"{i + 1:>6}" for i in range(k)))
    print("  drafted  " + " ".join(f"{d:>6}" for d in stats["drafted_per_pos"]))
    print("  accepted " + " ".join(f"{a:>6}" for a in stats["accepted_per_pos"]))
    print("  rate     " + " ".join(f"{fmt(r):>6}" for r in stats["acceptance_rate_per_pos"]))
    print("  cond     " + " ".join(f"{fmt(r):>6}" for r in stats["conditional_rate_per_pos"]))
    print("  E_iid[k] " + " ".join(f"{fmt(e, 2):>6}" for e in stats["E_tokens_per_step_iid"]))
    if extra:
        for name, row in extra.items():
            print(f"  {name:<8} " + " ".join(f"{fmt(e, 2):>6}" for e in row))
    print(f"  verify steps {stats['num_verify_steps']}, mean accepted length "
          f"{fmt(stats['mean_accepted_length'], 2)}, acceptance {fmt(stats['acceptance_rate'])}")


# ---- main ------------------------------------------------------------------------------------
def per_workload(value: str, workloads: list[str], name: str) -> list[int | None]:
    """'8' (every workload) or '8,6' (one per workload); 'all' -> None."""
    items = [None if v == "all" else int(v) for v in value.split(",")]
    if len(items) == 1:
        items = items * len(workloads)
    if len(items) != len(workloads):
        raise SystemExit(f"{name}: one value, or one per workload ({len(workloads)})")
    return items


def workload_figures(idx: list[int], per_req, outputs, outs, k: int) -> dict:
    """The measured figures of one workload's prompts."""
    stats = step_stats([(len(d), a) for i in idx for _, _, d, _, a in per_req[i]], k)
    raw = step_stats([(len(d), a) for i in idx for _, _, d, a, _ in per_req[i]], k)
    decode_steps = sum(count_decode_steps(per_req[i], outputs[i]) for i in idx)
    emitted = sum(len(outputs[i]) - 1 for i in idx)
    return {
        "num_prompts": len(idx),
        "output_tokens": sum(len(outputs[i]) for i in idx),
        "output_tokens_per_prompt": [len(outputs[i]) for i in idx],
        "output_token_ids": [outputs[i] for i in idx],
        "finish_reasons": [outs[i].outputs[0].finish_reason for i in idx],
        "per_prompt_drafts_accepted": [[outs[i].metrics.get("spec_num_draft_tokens"),
                                        outs[i].metrics.get("spec_num_accepted_tokens")] for i in idx],
        **stats,
        # counting also the drafts after an accepted stop token that the target predicted too (the
        # output ends at the stop): len(verified tokens) - 1, the count the policy sees
        "accepted_per_pos_incl_past_stop": raw["accepted_per_pos"],
        "steps_counted_past_a_stop": sum(1 for i in idx for st in per_req[i] if st[3] != st[4]),
        "decode_steps": decode_steps,  # steps after the prefill, with drafts or without
        "tokens_per_decode_step": emitted / decode_steps if decode_steps else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", required=True,
                    help="comma-separated, from humaneval, mtbench, edit; run together in one batch")
    ap.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    ap.add_argument("--ks", default="8", help="comma-separated num_speculative_tokens, one run each")
    ap.add_argument("--prompts", default="10", help="prompts per workload: N, or one N per workload")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0, help="the prompt sets' sampling seed")
    ap.add_argument("--equality-prompts", default="all",
                    help="run the no-speculation reference on the first N prompts of each workload (N or one "
                         "per workload; default all)")
    ap.add_argument("--check-k", type=int, default=None,
                    help="draft model: a real run at this k on --check-prompts prompts of the first workload, "
                         "step by step against the replay")
    ap.add_argument("--check-prompts", type=int, default=2)
    ap.add_argument("--no-replay", action="store_true", help="skip the draft model's teacher-forced replay")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: on a shared 2-core CPU, two threads' barriers "
                         "made the many small ops of the reference attention several times slower)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    workloads = args.workloads.split(",")
    for w in workloads:
        if w not in ("humaneval", "mtbench", "edit"):
            raise SystemExit(f"unknown workload {w!r}")
    ks = [int(k) for k in args.ks.split(",")]
    counts = per_workload(args.prompts, workloads, "--prompts")
    eq_counts = per_workload(args.equality_prompts, workloads, "--equality-prompts")
    started = time.time()

    convs, groups = [], {}
    for w, n in zip(workloads, counts):
        c = build_conversations(w, n, args.seed)
        groups[w] = list(range(len(convs), len(convs) + len(c)))
        convs += c
    pids = [pid for pid, _ in convs]
    eq_idx = {w: groups[w][: len(groups[w]) if n is None else n] for w, n in zip(workloads, eq_counts)}
    ref_idx = [i for w in workloads for i in eq_idx[w]]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)

    # reference: no speculation, on the prompts the equality check covers
    llm = make_llm(args, None, len(ref_idx))
    tokenizer = llm.get_tokenizer()
    prompts = [llm.apply_chat_template(m) for _, m in convs]
    ref_outs, ref_wall = generate(llm, [prompts[i] for i in ref_idx], params)
    reference = {i: list(o.outputs[0].token_ids) for i, o in zip(ref_idx, ref_outs)}
    llm = None
    gc.collect()
    print(f"reference (no speculation): {len(ref_idx)} prompts, {sum(map(len, reference.values()))} tokens, "
          f"{ref_wall:.1f} s", flush=True)

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + [shlex.quote(a) for a in sys.argv]),
        "target": {"name": TARGET, "model": TARGET_HF},
        "drafter": ({"method": "draft_model", "name": DRAFT, "model": DRAFT_HF} if args.method == "draft_model"
                    else {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}),
        "device": "cpu (2 cores, shared)", "dtype": "float32 (the CPU default)",
        "torch_threads": torch.get_num_threads(),
        "sampling": {"temperature": 0, "max_tokens": args.max_tokens},
        "max_model_len": args.max_model_len,
        "note": ("all workloads' prompts run together in one batch (greedy outputs do not depend on the "
                 "batch); figures are per workload, from the step log; the engine's counters cover the batch"),
        "workloads": {w: {
            "prompt_template": {"humaneval": HUMANEVAL_TURN, "edit": EDIT_TURN}.get(w, "MT-Bench first turn, as is"),
            "num_prompts": len(groups[w]),
            "prompt_ids": [pids[i] for i in groups[w]],
            "prompt_tokens": [len(prompts[i]) for i in groups[w]],
            "equality_prompts": len(eq_idx[w]),
        } for w in workloads},
        "reference": {"num_prompts": len(ref_idx), "output_tokens": sum(map(len, reference.values())),
                      "wall_s": round(ref_wall, 2)},
        "runs": [],
    }
    failed = False
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        result["total_wall_s"] = round(time.time() - started, 1)
        out_path.write_text(json.dumps(result, indent=1) + "\n")

    for k in ks:
        llm = make_llm(args, spec_config(args.method, k), len(convs))
        log = log_steps(llm)
        outs, wall = generate(llm, prompts, params)
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        index = {o.request_id: i for i, o in enumerate(outs)}
        eng = llm.engine.spec_stats
        engine_counters = {"num_drafts": eng.num_drafts, "num_draft_tokens": eng.num_draft_tokens,
                           "num_accepted_tokens": eng.num_accepted_tokens,
                           "drafted_per_pos": list(eng.drafted_per_pos), "accepted_per_pos": list(eng.accepted_per_pos)}
        per_req = measured_steps(log, index, outputs)
        all_stats = step_stats([(len(d), a) for steps in per_req for _, _, d, _, a in steps], k)
        counters_agree = (all_stats["drafted_per_pos"] == engine_counters["drafted_per_pos"]
                          and all_stats["accepted_per_pos"] == engine_counters["accepted_per_pos"]
                          and all_stats["num_verify_steps"] == engine_counters["num_drafts"])
        run = {
            "num_speculative_tokens": k,
            "speculative_config": spec_config(args.method, k),
            "wall_s": round(wall, 2),
            "output_tokens": sum(map(len, outputs)),
            "engine_spec_stats": engine_counters,
            "step_log_agrees_with_engine_counters": counters_agree,
            "workloads": {},
        }
        print(f"k={k}: {len(outputs)} prompts, {run['output_tokens']} tokens, {wall:.1f} s; step log == engine "
              f"counters: {counters_agree}", flush=True)
        for w in workloads:
            fig = workload_figures(groups[w], per_req, outputs, outs, k)
            diffs = compare([pids[i] for i in eq_idx[w]], [reference[i] for i in eq_idx[w]],
                            [outputs[i] for i in eq_idx[w]], tokenizer)
            failed |= bool(diffs)
            fig["equality"] = {"prompts_checked": len(eq_idx[w]), "equal": len(eq_idx[w]) - len(diffs), "diffs": diffs}
            run["workloads"][w] = fig
            print(f"  {w}: outputs equal to no speculation on {len(eq_idx[w]) - len(diffs)}/{len(eq_idx[w])}",
                  flush=True)
            for d in diffs:
                print(f"  DIFF {d}", flush=True)

        # replay every k from each output's agreement map
        drafts_at = None
        if args.method == "ngram":
            def drafts_at(i):
                return ngram_drafts_at(prompts[i], outputs[i], 2, 5)
            replay_src = "ngram_propose on the context at each output position (exact, no model)"
        elif not args.no_replay:
            t0 = time.perf_counter()
            argmaxes = [draft_argmax(llm, prompts[i], outputs[i]) for i in range(len(outputs))]
            # cross-check: each logged draft up to the first rejection is the teacher-forced argmax
            checked = mismatched = 0
            for i, steps in enumerate(per_req):
                for t, _, drafts, _, a in steps:
                    for j in range(min(a + 1, len(drafts), len(outputs[i]) - t)):
                        checked += 1
                        mismatched += drafts[j] != argmaxes[i][t + j]
            run["teacher_forced"] = {"wall_s": round(time.perf_counter() - t0, 2), "drafts_checked": checked,
                                     "drafts_differing_from_teacher_forced_argmax": mismatched}
            print(f"  teacher-forced draft argmax: {checked} logged drafts checked, {mismatched} differ", flush=True)

            def drafts_at(i):
                return argmax_drafts_at(outputs[i], argmaxes[i])
            replay_src = "the draft model's teacher-forced argmax at each output position"
        if drafts_at is not None:
            for w in workloads:
                idx = groups[w]
                tables = {}
                for kk in range(1, max(MAX_K, k) + 1):
                    steps = [replay(outputs[i], args.max_tokens, kk, drafts_at(i)) for i in idx]
                    tables[kk] = replay_table(steps, [outputs[i] for i in idx], kk)
                fig = run["workloads"][w]
                same = (tables[k]["drafted_per_pos"] == fig["drafted_per_pos"]
                        and tables[k]["accepted_per_pos"] == fig["accepted_per_pos"]
                        and tables[k]["decode_steps"] == fig["decode_steps"])
                fig["replay"] = {
                    "source": replay_src,
                    "matches_measured_at_k": same,
                    "per_k": {kk: {key: t[key] for key in (
                        "num_verify_steps", "decode_steps", "num_accepted_tokens", "drafted_per_pos",
                        "accepted_per_pos", "acceptance_rate_per_pos", "mean_accepted_length",
                        "tokens_per_decode_step")} for kk, t in tables.items()},
                    "E_tokens_per_verify_step": [tables[kk]["mean_accepted_length"] for kk in range(1, MAX_K + 1)],
                    "E_tokens_per_decode_step": [tables[kk]["tokens_per_decode_step"] for kk in range(1, MAX_K + 1)],
                }
                print(f"  {w}: replay at k={k} reproduces the measured counts and steps: {same}", flush=True)
        result["runs"].append(run)
        write()

        for w in workloads:
            fig = run["workloads"][w]
            extra = {}
            if "replay" in fig:
                extra["E_replay"] = fig["replay"]["E_tokens_per_verify_step"]
                extra["tok/step"] = fig["replay"]["E_tokens_per_decode_step"]
            print_table(f"{w} ({fig['num_prompts']} prompts, {fig['output_tokens']} output tokens), "
                        f"{args.method}, k={k}: acceptance by draft position", fig, extra)
            print(f"  tokens per decode step (drafted or not) {fmt(fig['tokens_per_decode_step'], 2)}", flush=True)

        if args.check_k and args.method == "draft_model" and drafts_at is not None:
            w = workloads[0]
            chk = groups[w][: args.check_prompts]
            llm = None
            gc.collect()
            llm = make_llm(args, spec_config(args.method, args.check_k), len(chk))
            log = log_steps(llm)
            outs2, wall2 = generate(llm, [prompts[i] for i in chk], params)
            outputs2 = [list(o.outputs[0].token_ids) for o in outs2]
            index2 = {o.request_id: j for j, o in enumerate(outs2)}
            per_req2 = measured_steps(log, index2, outputs2)
            st2 = step_stats([(len(d), a) for s in per_req2 for _, _, d, _, a in s], args.check_k)
            rep = [replay(outputs[i], args.max_tokens, args.check_k, drafts_at(i)) for i in chk]
            # the drafter is called for the steps with draft slots only
            measured = [[(t, slots, len(d), a) for t, slots, d, _, a in s] for s in per_req2]
            outputs_equal = outputs2 == [outputs[i] for i in chk]
            steps_equal = outputs_equal and measured == [[st for st in s if st[1] > 0] for s in rep]
            st_k = step_stats([(len(d), a) for i in chk for _, _, d, _, a in per_req[i]], k)
            run["check_k"] = {
                "workload": w, "k": args.check_k, "prompts": len(chk), "wall_s": round(wall2, 2),
                "outputs_equal_to_k_run": outputs_equal,
                "steps_equal_to_replay": steps_equal,
                "measured": {key: st2[key] for key in ("num_verify_steps", "drafted_per_pos", "accepted_per_pos",
                                                       "acceptance_rate_per_pos")},
                f"k{k}_run_same_prompts": {key: st_k[key][: args.check_k] for key in (
                    "drafted_per_pos", "accepted_per_pos", "acceptance_rate_per_pos")},
            }
            print(f"check k={args.check_k} on {len(chk)} {w} prompts ({wall2:.1f} s): outputs equal {outputs_equal}; "
                  f"steps (start, slots, drafts, accepted) equal to the replay: {steps_equal}; k={args.check_k} rates "
                  f"{[fmt(r) for r in st2['acceptance_rate_per_pos']]} vs k={k} run's "
                  f"{[fmt(r) for r in st_k['acceptance_rate_per_pos'][:args.check_k]]} on the same prompts", flush=True)
        llm = None
        gc.collect()
        write()

    write()
    print(f"\nwrote {out_path} ({result['total_wall_s']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
