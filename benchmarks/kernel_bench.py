"""Kernel micro-benchmarks on one GPU, against ceilings measured in the same run.

    python benchmarks/kernel_bench.py --json kernels.json

Measures the device-to-device copy bandwidth (bytes read + written) and the bf16 matmul rate,
then times (medians of triton.testing.do_bench, L2 flushed between runs):
- decode attention at batch 1 (Qwen3-8B: 32 q heads, 8 kv heads, head_dim 128) over 1k/8k/32k
  context and at batch 64 x 1k, in achieved GB/s of K/V read (calls captured back to back in a
  CUDA graph, as the decode loop runs them, on distinct caches that together exceed L2), for two
  KV cache memory orders
  ("nhd" = [blocks, block_size, kv_heads, head_dim], "hnd" = [blocks, kv_heads, block_size,
  head_dim]), sweeping the number of context splits and the kernel's tile configuration;
- prefill attention over 8k (and 32k) fresh tokens in TFLOP/s, sweeping tile configurations,
  beside torch's scaled_dot_product_attention on contiguous K/V;
- the fused norm / RoPE + cache-write / SiLU kernels in GB/s beside the torch reference ops.
`--tiny` runs every section at toy sizes (on the CPU under TRITON_INTERPRET=1) to check the script.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable

import torch

KV_LAYOUTS = ("nhd", "hnd")


class Bench:
    def __init__(self, device: str, tiny: bool, sweep: bool = True) -> None:
        self.device = device
        self.tiny = tiny
        self.sweep = sweep  # prefill: try every tile configuration, not just the default
        self.results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
        self.rows: list[str] = []

    def time_ms(self, fn: Callable[[], object], rep: int = 60) -> float:
        if self.device != "cuda":
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")

    def graph_us(self, calls: list[Callable[[], object]], replays: int = 20) -> float:
        """Microseconds per call, the calls captured back to back in one CUDA graph (as the decode
        loop runs them: no host launch overhead). Give calls on distinct inputs that together
        exceed L2, so that every replay reads from HBM."""
        if self.device != "cuda":
            return self.time_ms(lambda: [c() for c in calls]) * 1e3 / len(calls)
        for c in calls:  # compile, and warm the allocator
            c()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        graph.replay()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del graph
        return sorted(times)[len(times) // 2] * 1e3 / len(calls)

    def copies(self, nbytes: int) -> int:
        """How many distinct inputs of nbytes make about 200 MB (over 3x the H200's 60 MB L2)."""
        return 2 if self.tiny else max(2, min(64, -(-200 * 2**20 // nbytes)))

    def section(self, name: str, fn: Callable[[], None]) -> None:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            fn()
        except Exception:
            trace = traceback.format_exc()
            print(trace, flush=True)
            self.results.setdefault("errors", {})[name] = trace[-2000:]
        print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)

    def row(self, text: str) -> None:
        print("   " + text, flush=True)
        self.rows.append(text)

    # ---- ceilings -------------------------------------------------------------------------
    def ceilings(self) -> None:
        n = (1 << 14) if self.tiny else (1 << 30)  # 2 GiB of bf16
        x = torch.randn(n, device=self.device).to(torch.bfloat16)
        y = torch.empty_like(x)
        ms = self.time_ms(lambda: y.copy_(x))
        bw = 2 * x.numel() * 2 / ms / 1e6  # GB/s, read + write
        size = 256 if self.tiny else 8192
        a = torch.randn(size, size, device=self.device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=self.device, dtype=torch.bfloat16)
        mm_ms = self.time_ms(lambda: a @ b)
        tflops = 2 * size**3 / mm_ms / 1e9
        self.results["copy_GBps"] = bw
        self.results["matmul_bf16_TFLOPs"] = tflops
        self.row(f"d2d copy {bw:.0f} GB/s (read + write); bf16 matmul {size}^3 {tflops:.0f} TFLOP/s")

    # ---- attention helpers ------------------------------------------------------------------
    def paged(self, query_lens, context_lens, num_heads, num_kv_heads, head_dim, layout,
              block_size=16, dtype=torch.bfloat16):
        """A paged batch whose blocks are scattered over a pool twice the size needed."""
        blocks_per_seq = [-(-c // block_size) for c in context_lens]
        num_blocks = 2 * sum(blocks_per_seq) + 1
        shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "nhd"
                 else (num_blocks, num_kv_heads, block_size, head_dim))
        k_cache = torch.randn(shape, device=self.device, dtype=dtype)
        v_cache = torch.randn(shape, device=self.device, dtype=dtype)
        if layout == "hnd":
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        perm = torch.randperm(num_blocks - 1)[: sum(blocks_per_seq)] + 1
        table = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.int32)
        start = 0
        for i, n in enumerate(blocks_per_seq):
            table[i, :n] = perm[start : start + n]
            start += n
        cu = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
        q = torch.randn(int(cu[-1]), num_heads, head_dim, device=self.device, dtype=dtype)
        return (q, k_cache, v_cache, cu.to(self.device),
                torch.tensor(context_lens, dtype=torch.int32, device=self.device),
                table.to(self.device), head_dim**-0.5, max(query_lens), max(context_lens))

    # ---- decode -----------------------------------------------------------------------------
    def decode(self) -> None:
        from hotpath.ops.attention import triton_decode

        heads, kv_heads, head_dim = (4, 2, 32) if self.tiny else (32, 8, 128)
        contexts = [64, 256] if self.tiny else [1024, 8192, 32768]
        cases = [(1, c) for c in contexts] + [(4 if self.tiny else 64, contexts[0])]
        out = self.results.setdefault("decode", {})

        def batches(batch, ctx, layout):
            kv_bytes = 2 * batch * ctx * kv_heads * head_dim * 2
            n = self.copies(kv_bytes)
            return kv_bytes, [self.paged([1] * batch, [ctx] * batch, heads, kv_heads, head_dim,
                                         layout) for _ in range(n)]

        def calls(inputs, **kw):
            return [lambda a=a: triton_decode.paged_attention(*a, **kw) for a in inputs]

        for layout in KV_LAYOUTS:
            for batch, ctx in cases:
                kv_bytes, inputs = batches(batch, ctx, layout)
                default_splits = triton_decode.choose_num_splits(
                    batch, kv_heads, ctx, inputs[0][0].device
                )
                us = self.graph_us(calls(inputs))
                sweep = {}
                for splits in (1, 2, 4, 8, 16, 32, 64, 128):
                    if splits * 64 > ctx:
                        break
                    sweep[splits] = self.graph_us(calls(inputs, num_splits=splits))
                best = min(sweep, key=sweep.get)
                key = f"{layout} b{batch} ctx{ctx}"
                out[key] = {
                    "us": us, "GBps": kv_bytes / us / 1e3, "splits": default_splits,
                    "sweep_us": sweep, "best_splits": best,
                    "best_GBps": kv_bytes / sweep[best] / 1e3,
                }
                self.row(f"decode {key}: {us:.1f} us {kv_bytes / us / 1e3:.0f} GB/s "
                         f"({default_splits} splits); best {best} splits "
                         f"{kv_bytes / sweep[best] / 1e3:.0f} GB/s; sweep "
                         + " ".join(f"{k}:{v:.1f}" for k, v in sweep.items()))
                del inputs
        # as in a CUDA graph captured for 32k: max_context_len 32768, the context 1k
        for layout in KV_LAYOUTS:
            kv_bytes, inputs = batches(1, contexts[0], layout)
            inputs = [a[:-1] + (4 * contexts[-1],) for a in inputs]
            us = self.graph_us(calls(inputs))
            out[f"{layout} b1 ctx{contexts[0]} max_context_len {4 * contexts[-1]}"] = {
                "us": us, "GBps": kv_bytes / us / 1e3}
            self.row(f"decode {layout} b1 ctx{contexts[0]}, max_context_len {4 * contexts[-1]}: "
                     f"{us:.1f} us {kv_bytes / us / 1e3:.0f} GB/s")
        # tile configurations at the two longer contexts, both layouts
        for ctx in contexts[1:]:
            cfgs = {}
            for layout in KV_LAYOUTS:
                kv_bytes, inputs = batches(1, ctx, layout)
                for block_n in (64, 128):
                    for stages in (2, 3):
                        for warps in (4,):
                            if self.tiny and stages > 2:
                                continue
                            name = f"{layout} n{block_n} s{stages} w{warps}"
                            try:
                                us = self.graph_us(calls(inputs, block_n=block_n,
                                                         num_stages=stages, num_warps=warps))
                            except Exception as e:  # e.g. out of shared memory
                                self.row(f"decode config {name} failed: {str(e)[:120]}")
                                continue
                            cfgs[name] = kv_bytes / us / 1e3
                del inputs
            out[f"configs ctx{ctx} GBps"] = cfgs
            top = sorted(cfgs.items(), key=lambda kv: -kv[1])
            self.row(f"decode tile configs ctx{ctx} GB/s: " + ", ".join(f"{k} {v:.0f}" for k, v in top))
        # flash attention on contiguous K/V, for orientation (no paging, no split choice of ours)
        if self.device == "cuda":
            import torch.nn.functional as F

            for ctx in contexts:
                kv_bytes = 2 * ctx * kv_heads * head_dim * 2
                qkv = [(torch.randn(1, heads, 1, head_dim, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, kv_heads, ctx, head_dim, device="cuda", dtype=torch.bfloat16),
                        torch.randn(1, kv_heads, ctx, head_dim, device="cuda", dtype=torch.bfloat16))
                       for _ in range(self.copies(kv_bytes))]
                us = self.graph_us([lambda t=t: F.scaled_dot_product_attention(*t, enable_gqa=True)
                                    for t in qkv])
                out[f"sdpa contiguous b1 ctx{ctx}"] = {"us": us, "GBps": kv_bytes / us / 1e3}
                self.row(f"torch sdpa contiguous b1 ctx{ctx}: {us:.1f} us {kv_bytes / us / 1e3:.0f} GB/s")

    # ---- prefill ----------------------------------------------------------------------------
    def prefill(self) -> None:
        from hotpath.ops.attention import triton_prefill

        heads, kv_heads = (4, 2) if self.tiny else (32, 8)
        tokens = 128 if self.tiny else 8192
        out = self.results.setdefault("prefill", {})

        def flops(query_lens, context_lens, head_dim, num_heads):
            pairs = sum(q * (c - q) + q * (q + 1) // 2 for q, c in zip(query_lens, context_lens))
            return 4 * num_heads * head_dim * pairs

        configs = [None, (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3),
                   (128, 32, 4, 3), (128, 64, 8, 4), (128, 128, 8, 2), (64, 128, 4, 3)]
        if self.tiny:
            configs = [None, (32, 32, 4, 2)]
        elif not self.sweep:
            configs = [None]
        for layout in KV_LAYOUTS:
            args = self.paged([tokens], [tokens], heads, kv_heads, 128, layout)
            f = flops([tokens], [tokens], 128, heads)
            for cfg in configs:
                self.time_prefill(out, f"{layout} {tokens} hd128", args, f, cfg)
        other_configs = {
            64: [None, (128, 64, 4, 3), (128, 128, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
            256: [None, (64, 32, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2)],
        }
        for head_dim, cfgs in other_configs.items():
            args = self.paged([tokens], [tokens], heads, kv_heads, head_dim, "nhd")
            f = flops([tokens], [tokens], head_dim, heads)
            for cfg in cfgs[:2] if self.tiny or not self.sweep else cfgs:
                self.time_prefill(out, f"nhd {tokens} hd{head_dim}", args, f, cfg)
        # a chunk after a cached prefix, and a 32k prompt
        for qlen, ctx in ((tokens // 4, 4 * tokens), (4 * tokens, 4 * tokens)):
            args = self.paged([qlen], [ctx], heads, kv_heads, 128, "nhd")
            f = flops([qlen], [ctx], 128, heads)
            ms = self.time_ms(lambda: triton_prefill.paged_attention(*args), rep=200)
            out[f"nhd q{qlen} ctx{ctx} hd128"] = {"ms": ms, "TFLOPs": f / ms / 1e9}
            self.row(f"prefill nhd q{qlen} ctx{ctx}: {ms:.2f} ms {f / ms / 1e9:.0f} TFLOP/s")
        if self.device == "cuda":
            import torch.nn.functional as F

            q = torch.randn(1, heads, tokens, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, kv_heads, tokens, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            ms = self.time_ms(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            )
            f = flops([tokens], [tokens], 128, heads)
            out[f"sdpa contiguous {tokens} hd128"] = {"ms": ms, "TFLOPs": f / ms / 1e9}
            self.row(f"torch sdpa contiguous {tokens} hd128: {ms:.2f} ms {f / ms / 1e9:.0f} TFLOP/s")

    def time_prefill(self, out, label, args, flop, cfg):
        from hotpath.ops.attention import triton_prefill

        name = f"{label} " + ("default" if cfg is None else str(cfg))
        try:
            ms = self.time_ms(lambda: triton_prefill.paged_attention(*args, config=cfg))
        except Exception as e:  # e.g. out of shared memory
            self.row(f"prefill {name} failed: {str(e)[:120]}")
            return
        out[name] = {"ms": ms, "TFLOPs": flop / ms / 1e9}
        self.row(f"prefill {name}: {ms:.2f} ms {flop / ms / 1e9:.0f} TFLOP/s")

    # ---- the small fused kernels ------------------------------------------------------------
    def small(self) -> None:
        from hotpath.ops.activation import reference as act_ref
        from hotpath.ops.activation import triton as act
        from hotpath.ops.attention import reference as attn_ref
        from hotpath.ops.attention import triton_cache
        from hotpath.ops.norm import reference as norm_ref
        from hotpath.ops.norm import triton as norm
        from hotpath.ops.rotary import reference as rope_ref
        from hotpath.ops.rotary import triton as rope

        dev, bf16 = self.device, torch.bfloat16
        hidden, inter, heads, kv_heads, head_dim = ((64, 96, 4, 2, 32) if self.tiny
                                                    else (4096, 12288, 32, 8, 128))
        out = self.results.setdefault("small", {})

        def report(name, nbytes, kernel, ref):
            k_ms, r_ms = self.time_ms(kernel), self.time_ms(ref)
            graph_us = self.graph_us([kernel] * 10)  # launch overhead gone, as in a CUDA graph
            out[name] = {"us": k_ms * 1e3, "GBps": nbytes / k_ms / 1e6, "torch_us": r_ms * 1e3,
                         "graph_us": graph_us}
            self.row(f"{name}: {k_ms * 1e3:.1f} us {nbytes / k_ms / 1e6:.0f} GB/s, in a graph "
                     f"{graph_us:.1f} us (torch reference {r_ms * 1e3:.1f} us)")

        for tokens in (1, 64 if self.tiny else 8192):
            x = torch.randn(tokens, hidden, device=dev, dtype=bf16)
            r = torch.randn_like(x)
            w = torch.randn(hidden, device=dev, dtype=bf16)
            report(f"fused_add_rms_norm t{tokens}", 4 * x.numel() * 2,
                   lambda: norm.fused_add_rms_norm(x, r, w, 1e-6),
                   lambda: norm_ref.fused_add_rms_norm(x, r, w, 1e-6))
            gu = torch.randn(tokens, 2 * inter, device=dev, dtype=bf16)
            report(f"silu_and_mul t{tokens}", 3 * tokens * inter * 2,
                   lambda: act.silu_and_mul(gu), lambda: act_ref.silu_and_mul(gu))
            qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=dev, dtype=bf16)
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
            q = q.reshape(tokens, heads, head_dim)
            k = k.reshape(tokens, kv_heads, head_dim)
            v = v.reshape(tokens, kv_heads, head_dim)
            pos = torch.randint(0, 4096, (tokens,), device=dev)
            table = torch.randn(40960, head_dim, device=dev)
            qw = torch.randn(head_dim, device=dev, dtype=bf16)
            kw = torch.randn(head_dim, device=dev, dtype=bf16)
            for layout in KV_LAYOUTS:
                nb = tokens // 16 + 1
                shape = ((nb, 16, kv_heads, head_dim) if layout == "nhd"
                         else (nb, kv_heads, 16, head_dim))
                kc = torch.empty(shape, device=dev, dtype=bf16)
                vc = torch.empty_like(kc)
                if layout == "hnd":
                    kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
                slots = torch.randperm(nb * 16, device=dev)[:tokens]
                report(f"qk_norm_rope_and_cache {layout} t{tokens}", 2 * qkv.numel() * 2,
                       lambda: rope.qk_norm_rope_and_cache(q, k, v, pos, table, kc, vc, slots,
                                                           qw, kw, 1e-6),
                       lambda: rope_ref.qk_norm_rope_and_cache(q, k, v, pos, table, kc, vc,
                                                               slots, qw, kw, 1e-6))
                report(f"write_kv_cache {layout} t{tokens}", 4 * k.numel() * 2,
                       lambda: triton_cache.write_kv_cache(k, v, kc, vc, slots),
                       lambda: attn_ref.write_kv_cache(k, v, kc, vc, slots))

    def run(self, sections: list[str]) -> None:
        for name in sections:
            self.section(name, getattr(self, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--tiny", action="store_true", help="toy sizes, to check the script")
    parser.add_argument("--sections", default="ceilings,decode,prefill,small")
    parser.add_argument("--no-prefill-sweep", action="store_true",
                        help="time the default prefill tiles only")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bench = Bench(device, args.tiny, sweep=not args.no_prefill_sweep)
    torch.manual_seed(0)
    bench.run(args.sections.split(","))
    print("\n".join(["", "summary:"] + bench.rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(bench.results, f, indent=1)


if __name__ == "__main__":
    main()
