"""Tunes the fused MoE kernels' tiles on this GPU and writes hotpath/ops/moe/configs/*.json.

    python benchmarks/tune_moe.py --shapes qwen3-30b-a3b qwen3-235b-a22b     # both paths, all counts
    python benchmarks/tune_moe.py --shapes qwen3-30b-a3b --tokens 1 8 64 --quick
    python benchmarks/tune_moe.py --shapes qwen3-30b-a3b --fp8 block     # fp8 experts (Qwen3-30B-A3B-FP8)
    python benchmarks/tune_moe.py --tiny --out-dir /tmp/moe-configs   # the script on the CPU

With --fp8 block|channel the experts are fp8 (128x128 block scales, or a scale per row) and the
files are the weights' dtype's (float8_e4m3fn, or e4m3fnuz on gfx942), where tuning.py looks up
fp8 experts' tiles; block scales take dot tiles at most 128 wide along K.

For each model shape, each projection (gate_up: the [E, 2I, H] weight with silu-and-mul fused;
down: [E, H, I] with the weighted top-k sum) and each token count T, every candidate tile
configuration of each path that takes T tokens (the decode kernels up to their 16 tokens, the
grouped GEMM at every T) is timed, and the fastest is written to the projection's file under the
path's section (format in hotpath/ops/moe/tuning.py). A projection is timed alone: the other
projection's inputs (the routing, the align step's layout, the intermediate) are made before.

Timing: calls on distinct random routings (uniform over the experts: successive calls read other
experts, so that the weights come from HBM as in a forward over many layers) are captured back to
back in one CUDA graph, and the median replay is divided by the calls (Bench.graph_us). Before a
candidate is first timed, the whole op with it is checked against the fp32 reference (relative
error under 1e-2 in bf16); a candidate that fails, or does not compile or launch (shared memory),
is dropped. At the end a table compares, for the counts both paths take, the whole op by each
path with its best tiles (align launches included for the grouped one): where the decode path
stops winning is what hotpath.ops.moe.FEW_TOKENS should be.

Compiles dominate the first shape's time (a few hundred kernels per path); the later shapes reuse
them from Triton's cache where only runtime sizes differ. --quick sweeps a much smaller space.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from kernel_bench import Bench  # benchmarks/ is on the path when run as a script

# name -> (E, H, I, top_k)
SHAPES = {
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "qwen3-235b-a22b": (128, 4096, 1536, 8),
    "qwen1.5-moe-a2.7b": (60, 2048, 1408, 4),
    "qwen2-57b-a14b": (64, 3584, 2560, 8),
}
TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192, 16384)
TINY_SHAPES = {"tiny": (5, 64, 48, 2)}
TINY_TOKENS = (1, 3, 20)
CHECK_TOL = 1e-2  # relative error of a candidate's whole op against the fp32 reference (bf16)


# ---- candidates -----------------------------------------------------------------------------------

def grouped_candidates(T: int, top_k: int, E: int, K: int, smem_bytes: int, quick: bool,
                       tiny: bool, max_block_k: int = 1 << 30) -> Iterator:
    from hotpath.ops.moe.tuning import GroupedConfig

    if tiny:
        yield GroupedConfig(16, 32, 32, 1, 4, 2)
        yield GroupedConfig(32, 64, 16, 2, 4, 2)
        return
    # M tiles no taller than twice the mean tokens per expert (past that a tile is mostly padding)
    per_expert = T * top_k / E
    block_ms = [m for m in (16, 32, 64, 128) if m == 16 or m <= 2 * per_expert]
    if quick:
        space = itertools.product(block_ms, (64, 128), (64, 128), (1, 16), (4,), (3, 4))
    else:
        space = itertools.product(block_ms, (32, 64, 128, 256), (64, 128, 256), (1, 16), (4, 8), (2, 3, 4, 5))
    for block_m, block_n, block_k, group_m, num_warps, num_stages in space:
        if block_k > min(2 * K, max_block_k) or num_stages * (block_m + block_n) * block_k * 2 > smem_bytes:
            continue
        if num_warps == 8 and block_m * block_n < 64 * 128:  # too few elements for 8 warps
            continue
        if group_m > 1 and T * top_k < 32 * block_m:  # too few M tiles for the grouping to matter
            continue
        yield GroupedConfig(block_m, block_n, block_k, group_m, num_warps, num_stages)


def decode_candidates(T: int, K: int, smem_bytes: int, quick: bool, tiny: bool, top_k: int = 0,
                      max_block_k: int = 1 << 30) -> Iterator:
    """top_k: for the down projection at one token, whose kernel holds [k, block_n, block_k]
    tiles (triton_decode._decode_down_one_token_kernel); 0 for the others. max_block_k: the
    tensor-core tiles' bound (fp8 block scales: one block)."""
    from hotpath.ops.moe.tuning import DecodeConfig

    if tiny:
        yield DecodeConfig(8 if T == 1 else 16, 32, 4, 1)
        yield DecodeConfig(16 if T == 1 else 32, 16, 4, 2)
        return
    if T == 1 and top_k:
        for block_n, block_k, num_warps in itertools.product((2, 4, 8, 16), (128, 256, 512, 1024), (4, 8)):
            if block_k <= max(256, 2 * K) and top_k * block_n * block_k <= 32768:
                yield DecodeConfig(block_n, block_k, num_warps, 1)
        return
    if T == 1:  # element-wise sums: one tile in flight per program, its size is what matters
        space = itertools.product((4, 8, 16, 32), (256, 512, 1024, 2048, 4096),
                                  (4, 8) if quick else (2, 4, 8), (1,))
        for block_n, block_k, num_warps, num_stages in space:
            # no tile much wider than K, and at most 64 KB of bf16 weight a program in registers
            if block_k <= max(256, 2 * K) and block_n * block_k <= 32768:
                yield DecodeConfig(block_n, block_k, num_warps, num_stages)
        return
    space = itertools.product((16, 32, 64), (64, 128, 256, 512), (4,) if quick else (4, 8),
                              (3,) if quick else (2, 3, 4))
    for block_n, block_k, num_warps, num_stages in space:
        if block_k <= min(max(64, 2 * K), max_block_k) and num_stages * (block_n + 16) * block_k * 2 <= smem_bytes:
            yield DecodeConfig(block_n, block_k, num_warps, num_stages)


# ---- one shape ---------------------------------------------------------------------------------------

class Tuner:
    def __init__(self, name: str, E: int, H: int, I: int, top_k: int, bench: Bench, quick: bool,
                 fp8: str | None = None):
        from hotpath.ops.moe.triton_common import expert_formats
        from hotpath.ops.quant import fp8_dtype

        self.name, self.E, self.H, self.I, self.top_k = name, E, H, I, top_k
        self.bench, self.quick, self.tiny = bench, quick, bench.tiny
        self.device = bench.device
        self.dtype = torch.float32 if bench.tiny else torch.bfloat16  # the interpreter's bf16 is wrong
        g = torch.Generator(self.device).manual_seed(0)
        if fp8 is None:
            self.w13 = (torch.randn(E, 2 * I, H, generator=g, device=self.device) / H**0.5).to(self.dtype)
            self.w2 = (torch.randn(E, H, I, generator=g, device=self.device) / I**0.5).to(self.dtype)
            self.scales: dict = {}
        else:  # fp8 values over the format's range, scales bringing the rows to the 16-bit ones'
            f8 = fp8_dtype(torch.device(self.device))
            fmax = torch.finfo(f8).max
            self.w13 = (torch.randn(E, 2 * I, H, generator=g, device=self.device) * fmax / 4).clamp(-fmax, fmax).to(f8)
            self.w2 = (torch.randn(E, H, I, generator=g, device=self.device) * fmax / 4).clamp(-fmax, fmax).to(f8)
            if fp8 == "block":
                block = (128, 128)
                s13 = torch.full((E, 2 * -(-I // 128), -(-H // 128)), 4 / fmax / H**0.5, device=self.device)
                s2 = torch.full((E, -(-H // 128), -(-I // 128)), 4 / fmax / I**0.5, device=self.device)
            else:
                block = None
                s13 = torch.full((E, 2 * I), 4 / fmax / H**0.5, device=self.device)
                s2 = torch.full((E, H), 4 / fmax / I**0.5, device=self.device)
            self.scales = dict(w13_scale=s13, w2_scale=s2, block_size=block)
        self.formats = expert_formats(self.w13, self.scales.get("w13_scale"), self.scales.get("w2_scale"),
                                      self.scales.get("block_size"))
        # tensor-core tiles of block-scaled weights stay within a block along K
        self.max_block_k = 128 if self.scales.get("block_size") else 1 << 30
        self.smem = (torch.cuda.get_device_properties(self.device).shared_memory_per_block_optin
                     if self.device == "cuda" else 1 << 20)
        self.checked: dict[tuple, bool] = {}
        # projection -> path -> tokens -> (us, config)
        self.best: dict[str, dict[str, dict[int, tuple[float, object]]]] = {
            p: {"grouped": {}, "decode": {}} for p in ("gate_up", "down")}
        self.align_us: dict[int, float] = {}  # tokens -> the align step's time at the best gate_up tiles

    def projections(self) -> dict[str, tuple[int, int]]:
        """name -> (N, K) of the projection's expert weight [E, N, K]."""
        return {"gate_up": (2 * self.I, self.H), "down": (self.H, self.I)}

    def routings(self, T: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from hotpath.ops.moe import reference

        g = torch.Generator(self.device).manual_seed(T)
        return [reference.route(torch.randn(T, self.E, generator=g, device=self.device), self.top_k, True)
                for _ in range(count)]

    def calls_per_graph(self, T: int) -> int:
        return 2 if self.tiny else 16 if T <= 64 else 4 if T <= 1024 else 2

    def passes(self, projection: str, path: str, cfg, T: int) -> bool:
        """Whether the whole op, with cfg for `projection` on `path` and the default tiles for
        the other, matches the fp32 reference (once per candidate and kind of launch)."""
        from hotpath.ops.moe import reference, triton_decode, triton_grouped, tuning

        key = (projection, path, cfg, path == "decode" and T == 1)
        if key not in self.checked:
            T_check = T if path == "decode" else min(T, 64)
            (weights, ids), = self.routings(T_check, 1)
            x = torch.randn(T_check, self.H, device=self.device).to(self.dtype)
            if path == "decode":
                # the other projection's default tiles (the down's depend on top_k)
                default = (tuning.default_decode_config(T_check, self.H) if projection == "down"
                           else tuning.default_decode_config(T_check, self.I, self.top_k))
                run = triton_decode.fused_moe
            else:
                hip = torch.version.hip is not None
                N, K = self.projections()["down" if projection == "gate_up" else "gate_up"]
                default = tuning.default_grouped_config(T_check, self.top_k, self.E, N, K, hip)
                run = triton_grouped.fused_moe
            configs = (cfg, default) if projection == "gate_up" else (default, cfg)
            try:
                out = run(x, self.w13, self.w2, weights, ids, *configs, **self.scales)
                if self.scales:
                    want = reference.fused_moe(x.float(), self.w13, self.w2, weights, ids, **self.scales)
                else:
                    want = reference.fused_moe(x.float(), self.w13.float(), self.w2.float(), weights, ids)
                err = float((out.double() - want.double()).norm() / want.double().norm())
                ok = err < CHECK_TOL
                if not ok:
                    print(f"   {projection} {path} {cfg}: relative error {err:.2e}, dropped", flush=True)
            except Exception as e:  # a config that does not compile or launch
                ok = False
                print(f"   {projection} {path} {cfg}: {type(e).__name__}: {str(e)[:200]}, dropped", flush=True)
            self.checked[key] = ok
        return self.checked[key]

    def fastest(self, projection: str, path: str, T: int, candidates: Iterator,
                make_calls: Callable[[object], list[Callable[[], object]]]) -> None:
        best = None
        for cfg in candidates:
            if not self.passes(projection, path, cfg, T):
                continue
            try:
                us = self.bench.graph_us(make_calls(cfg))
            except Exception as e:
                print(f"   {projection} {path} {cfg} at T={T}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if best is None or us < best[0]:
                best = (us, cfg)
        if best is not None:
            self.best[projection][path][T] = best
            self.bench.row(f"{self.name} {projection:7} {path:7} T={T:5}: {best[0]:9.1f} us  {best[1]}")

    def tune_decode(self, T: int) -> None:
        from hotpath.ops.moe import triton_decode, tuning

        routings = self.routings(T, self.calls_per_graph(T))
        flat = [(w.reshape(-1).contiguous(), ids.reshape(-1).contiguous()) for w, ids in routings]
        x = torch.randn(T, self.H, device=self.device).to(self.dtype)
        default_gate_up = tuning.default_decode_config(T, self.H)
        fmt13, fmt2 = self.formats
        hs = [triton_decode.gate_up(x, self.w13, ids, self.top_k, default_gate_up, fmt13) for _, ids in flat]
        self.fastest("gate_up", "decode", T,
                     decode_candidates(T, self.H, self.smem, self.quick, self.tiny, max_block_k=self.max_block_k),
                     lambda cfg: [functools.partial(triton_decode.gate_up, x, self.w13, ids, self.top_k, cfg, fmt13)
                                  for _, ids in flat])
        self.fastest("down", "decode", T,
                     decode_candidates(T, self.I, self.smem, self.quick, self.tiny, self.top_k, self.max_block_k),
                     lambda cfg: [functools.partial(triton_decode.down, h, self.w2, ids, w, self.top_k, cfg, fmt2)
                                  for h, (w, ids) in zip(hs, flat)])

    def tune_grouped(self, T: int) -> None:
        from hotpath.ops.moe import triton_grouped

        routings = self.routings(T, self.calls_per_graph(T))
        P = T * self.top_k
        x = torch.randn(T, self.H, device=self.device).to(self.dtype)
        inter = torch.randn(P, self.I, device=self.device).to(self.dtype)
        outs = [torch.empty(P, self.I, dtype=self.dtype, device=self.device) for _ in routings]
        accs = [torch.zeros(T, self.H, dtype=torch.float32, device=self.device) for _ in routings]

        @functools.cache
        def aligned(block_m: int) -> list[tuple]:
            return [triton_grouped.align_by_expert(ids, self.E, block_m) for _, ids in routings]

        fmt13, fmt2 = self.formats

        def calls(projection: str, cfg) -> list[Callable[[], object]]:
            if projection == "gate_up":
                return [functools.partial(triton_grouped.grouped_gemm, x, self.w13, out, w.reshape(-1), layout,
                                          P, self.top_k, True, cfg, fmt13)
                        for out, (w, _), layout in zip(outs, routings, aligned(cfg.block_m))]
            return [functools.partial(triton_grouped.grouped_gemm, inter, self.w2, acc, w.reshape(-1), layout,
                                      P, self.top_k, False, cfg, fmt2)
                    for acc, (w, _), layout in zip(accs, routings, aligned(cfg.block_m))]

        for projection, (N, K) in self.projections().items():
            self.fastest(projection, "grouped", T,
                         grouped_candidates(T, self.top_k, self.E, K, self.smem, self.quick, self.tiny,
                                            self.max_block_k),
                         functools.partial(calls, projection))
        if T in self.best["gate_up"]["grouped"]:
            block_m = self.best["gate_up"]["grouped"][T][1].block_m
            self.align_us[T] = self.bench.graph_us(
                [functools.partial(triton_grouped.align_by_expert, ids, self.E, block_m) for _, ids in routings])

    def write(self, out_dir: Path) -> None:
        """Each projection's best tiles into its file, over what the file held for these counts."""
        from hotpath.ops.moe import tuning

        name = tuning.device_name(torch.device(self.device))
        for projection, (N, K) in self.projections().items():
            # fp8 experts' files are their weights' dtype's (see tuning.py)
            dtype = self.w13.dtype if self.scales else self.dtype
            path = out_dir / tuning.config_file(self.E, N, K, dtype, name)
            data = json.loads(path.read_text()) if path.is_file() else {}
            for section, by_tokens in self.best[projection].items():
                entries = data.setdefault(section, {})
                entries.update({str(T): tuning.to_json(cfg) for T, (_, cfg) in by_tokens.items()})
                data[section] = dict(sorted(entries.items(), key=lambda kv: int(kv[0])))
            data = {section: entries for section, entries in data.items() if entries}
            if data:
                path.write_text(_format(data))
                print(f"   wrote {path}", flush=True)

    def compare_paths(self) -> None:
        """The whole op by each path with its best tiles, where both take T."""
        for T in sorted(self.best["gate_up"]["decode"]):
            try:
                decode = sum(self.best[p]["decode"][T][0] for p in ("gate_up", "down"))
                grouped = sum(self.best[p]["grouped"][T][0] for p in ("gate_up", "down")) + self.align_us[T]
            except KeyError:
                continue
            self.bench.row(f"{self.name} T={T:3}: decode path {decode:8.1f} us, grouped path {grouped:8.1f} us"
                           f" (align {self.align_us[T]:.1f})  -> {'decode' if decode <= grouped else 'grouped'}")


def _format(data: dict) -> str:
    """The file's JSON with one line per token count."""
    sections = [f'  "{section}": {{\n' + ",\n".join(f'    "{T}": {json.dumps(cfg)}' for T, cfg in entries.items())
                + "\n  }" for section, entries in data.items()]
    return "{\n" + ",\n".join(sections) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b", "qwen3-235b-a22b"], choices=list(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where the JSON files go (default: hotpath/ops/moe/configs)")
    parser.add_argument("--quick", action="store_true", help="a much smaller candidate space")
    parser.add_argument("--fp8", choices=["block", "channel"], default=None,
                        help="fp8 experts: 128x128 block scales (Qwen3-30B-A3B-FP8) or a scale per row")
    parser.add_argument("--tiny", action="store_true",
                        help="toy shape and candidates on the CPU under TRITON_INTERPRET=1: checks the script")
    args = parser.parse_args()
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from hotpath.ops.moe import triton_decode, tuning

    out_dir = args.out_dir or tuning.CONFIG_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.tiny else "cuda"
    bench = Bench(device, tiny=args.tiny)
    shapes = TINY_SHAPES if args.tiny else {name: SHAPES[name] for name in args.shapes}
    tokens = TINY_TOKENS if args.tiny else sorted(args.tokens)
    for name, (E, H, I, top_k) in shapes.items():
        start = time.perf_counter()
        tuner = Tuner(name, E, H, I, top_k, bench, args.quick, args.fp8)
        for T in tokens:
            if T <= triton_decode.MAX_TOKENS:
                bench.section(f"{name} decode T={T}", functools.partial(tuner.tune_decode, T))
            bench.section(f"{name} grouped T={T}", functools.partial(tuner.tune_grouped, T))
            tuner.write(out_dir)  # after every count: a long run interrupted keeps what it found
        tuner.compare_paths()
        print(f"== {name} took {time.perf_counter() - start:.0f} s", flush=True)
        del tuner
        if device == "cuda":
            torch.cuda.empty_cache()
    if "errors" in bench.results:
        print("errors in:", ", ".join(bench.results["errors"]))


if __name__ == "__main__":
    main()
