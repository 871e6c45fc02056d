"""Gated DeltaNet prefill at Qwen3-Next-80B's linear-attention shape (16 key heads, 32 value heads,
head dims 128; bf16 q/k/v/beta, fp32 g and states): hotpath's chunked Triton kernels
(hotpath.ops.gated_delta.triton_chunked) against FLA's chunk_gated_delta_rule (pip package
fla-core, where installed; reported "unavailable" otherwise) and the torch reference
(reference.gated_delta_rule, chunked, a sequence at a time), for 4096, 16384 and 65536 tokens as
one sequence and as 8 of equal length, every sequence from a nonzero state.

Prints microseconds per call (median of triton.testing.do_bench, each call whole: the chunk
table, or FLA's chunk indices, included) and effective TFLOP/s, all three against one count of
the chunked algorithm's matmul work per token and value head (C = 64):
    6 Dk Dv (V' = U - W S, the state update, q S) + C (6 Dk + 4 Dv) (k k^T, W, q k^T; U, P V')
The TFLOP/s are that count over the time, whatever each implementation actually multiplies.

Checks, at every size: hotpath's output and final states against FLA's (bf16 outputs: relative
error ~1e-3 expected), and against the reference in fp32 on the same inputs (where it runs, up to
--reference-max tokens).

    python benchmarks/bench_gated_delta_prefill.py [--tokens 4096 16384 65536] [--seqs 1 8]
        [--reference-max 65536] [--chunk-size 64]
    python benchmarks/bench_gated_delta_prefill.py --tiny   # toy shapes on the CPU (interpreter)

FLA's conventions, as called here: [B, T, H, D] tensors with B = 1 and cu_seqlens (int64) for
several sequences; q and k with the key heads, v, g and beta with the value heads (FLA repeats
the key heads itself, head h using key head h // (Hv / Hk), as hotpath does);
use_qk_l2norm_in_kernel=True; scale = Dk ** -0.5 (its default, passed explicitly); initial_state
[num_seqs, Hv, Dk, Dv] fp32 and output_final_state=True, its final states in the same layout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 65536])
ap.add_argument("--seqs", type=int, nargs="+", default=[1, 8])
ap.add_argument("--reference-max", type=int, default=65536,
                help="time and check against the torch reference up to this many tokens")
ap.add_argument("--chunk-size", type=int, default=64, choices=[16, 32, 64])
ap.add_argument("--tiny", action="store_true", help="toy shapes on the CPU under the Triton interpreter")
ns = ap.parse_args()
if ns.tiny:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

import torch  # noqa: E402

from hotpath.ops.gated_delta import reference, triton_chunked  # noqa: E402

if ns.tiny:
    DEVICE, DTYPE, HK, HV, DK, DV = "cpu", torch.float32, 2, 4, 16, 16  # the interpreter: fp32 only
    TOKENS, SEQS = [64, 200], [1, 3]
else:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --tiny)")
    DEVICE, DTYPE, HK, HV, DK, DV = "cuda", torch.bfloat16, 16, 32, 128, 128
    TOKENS, SEQS = ns.tokens, ns.seqs
C = ns.chunk_size

FLA_MISSING = ""
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
except Exception as e:  # not installed, or no GPU it can run on
    fla_chunk, FLA_MISSING = None, f"{type(e).__name__}: {e}"
if DEVICE != "cuda":
    fla_chunk, FLA_MISSING = None, "FLA's kernels need a GPU"


def time_us(fn) -> float:
    if DEVICE != "cuda":
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def flops(tokens: int) -> float:
    return tokens * HV * (6 * DK * DV + C * (6 * DK + 4 * DV))


def inputs(tokens: int, num_seqs: int, seed: int = 0):
    """Random q, k, v, and the gates through the layer's formulas (decays mostly small, as in a
    trained model's slow heads), sequences of equal length in scattered slots of nonzero states."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HK, DK, generator=gen).to(DEVICE, DTYPE)
    k = torch.randn(tokens, HK, DK, generator=gen).to(DEVICE, DTYPE)
    v = torch.randn(tokens, HV, DV, generator=gen).to(DEVICE, DTYPE)
    a, b = torch.randn(tokens, HV, generator=gen), torch.randn(tokens, HV, generator=gen)
    A_log, dt_bias = torch.rand(HV, generator=gen) * 3 - 3, torch.randn(HV, generator=gen)
    g, beta = reference.gates(a, b, A_log, dt_bias)
    lengths = [tokens // num_seqs] * num_seqs
    lengths[-1] += tokens - sum(lengths)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    num_slots = 2 * num_seqs
    slots = [(2 * i + 1) % num_slots for i in range(num_seqs)]
    states = (torch.randn(num_slots, HV, DK, DV, generator=gen) * 0.1).to(DEVICE)
    return q, k, v, g.to(DEVICE), beta.to(DEVICE, DTYPE), cu, states, slots


def run_hotpath(q, k, v, g, beta, cu_dev, states, slots_dev):
    return triton_chunked.gated_delta_rule(q, k, v, g, beta, cu_dev, states, slots_dev, chunk_size=C)


def run_fla(q, k, v, g, beta, cu_dev64, cu_cpu64, initial):
    out, final = fla_chunk(q[None], k[None], v[None], g[None], beta[None], scale=DK**-0.5,
                           initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True,
                           cu_seqlens=cu_dev64, cu_seqlens_cpu=cu_cpu64, chunk_size=C)
    return out[0], final


print(f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu (interpreter)'}; "
      f"Hk={HK} Hv={HV} Dk={DK} Dv={DV} {str(DTYPE).removeprefix('torch.')} chunk={C}")
print(f"FLA: {'fla-core chunk_gated_delta_rule' if fla_chunk else 'unavailable (' + FLA_MISSING + ')'}")
header = (f"{'tokens':>7} {'seqs':>4} | {'hotpath us':>11} {'TF/s':>6} | {'FLA us':>11} {'TF/s':>6} | "
          f"{'reference us':>12} {'TF/s':>6} | {'vs FLA: out':>11} {'states':>8} | "
          f"{'vs ref: out':>11} {'states':>8}")
print(header)
print("-" * len(header))
for tokens in TOKENS:
    for num_seqs in SEQS:
        q, k, v, g, beta, cu, states, slots = inputs(tokens, num_seqs)
        cu_dev = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
        slots_dev = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
        fl = flops(tokens)
        cells = []

        # hotpath: once on a copy of the states for the checks, then timed on a scratch copy
        ours_states = states.clone()
        ours = run_hotpath(q, k, v, g, beta, cu_dev, ours_states, slots_dev)
        scratch = states.clone()
        us = time_us(lambda: run_hotpath(q, k, v, g, beta, cu_dev, scratch, slots_dev))
        cells.append(f"{us:11.1f} {fl / us / 1e6:6.1f}")
        del scratch

        fla_err = ("", "")
        if fla_chunk is not None:
            cu64, cu_cpu64 = cu_dev.long(), torch.tensor(cu, dtype=torch.int64)
            initial = states[slots_dev].contiguous()  # [num_seqs, Hv, Dk, Dv] fp32
            fla_out, fla_final = run_fla(q, k, v, g, beta, cu64, cu_cpu64, initial)
            us = time_us(lambda: run_fla(q, k, v, g, beta, cu64, cu_cpu64, initial))
            cells.append(f"{us:11.1f} {fl / us / 1e6:6.1f}")
            ours_final = ours_states[slots_dev]
            fla_err = (f"{rel_err(ours, fla_out):11.2e}", f"{rel_err(ours_final, fla_final):8.2e}")
            del fla_out, fla_final
        else:
            cells.append(f"{'unavailable':>11} {'':>6}")

        ref_err = ("", "")
        if tokens <= ns.reference_max:
            qf, kf, vf, bf = q.float(), k.float(), v.float(), beta.float()
            ref_states = states.clone()
            want = reference.gated_delta_rule(qf, kf, vf, g, bf, cu, ref_states, slots)
            scratch = states.clone()
            us = time_us(lambda: reference.gated_delta_rule(qf, kf, vf, g, bf, cu, scratch, slots))
            cells.append(f"{us:12.1f} {fl / us / 1e6:6.2f}")
            ref_final = ref_states[slots_dev]
            ref_err = (f"{rel_err(ours, want):11.2e}", f"{rel_err(ours_states[slots_dev], ref_final):8.2e}")
            del qf, kf, vf, bf, want, scratch
        else:
            cells.append(f"{'skipped':>12} {'':>6}")
        print(f"{tokens:7d} {num_seqs:4d} | " + " | ".join(cells)
              + f" | {fla_err[0]:>11} {fla_err[1]:>8} | {ref_err[0]:>11} {ref_err[1]:>8}", flush=True)
        del q, k, v, g, beta, states, ours, ours_states
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
