"""MoE under tensor and expert parallelism against the same layer on one rank, in real gloo groups
of 2 and 4 processes: each rank loads the full checkpoint tensors (published layouts, written by
hotpath/quantizer/formats.py) into its shard, routes the same random tokens, and the sum of the
ranks' outputs (the decoder's all-reduce) equals the one-rank layer's output.

TP splits each expert's width (fp8 block scales re-blocked where a rank's width is not a multiple
of 128; int4 keeping whole groups); EP splits the experts (7 over 2 and 4 ranks: uneven counts)."""

from __future__ import annotations

import pytest
import torch

from hotpath.distributed.parallel_state import SINGLE, GroupCoordinator, Parallel, building_parallel
from hotpath.layers.moe import FusedExperts, SparseMoeBlock
from hotpath.layers.quant.awq import AwqConfig
from hotpath.layers.quant.base import QuantConfig, building_with
from hotpath.layers.quant.fp8_block import Fp8BlockConfig
from hotpath.layers.quant.fp8_channel import Fp8ChannelConfig
from hotpath.loader.dummy import init_dummy_weights
from hotpath.ops.moe import route
from hotpath.quantizer.formats import awq_tensors, fp8_block_tensors, fp8_channel_tensors
from spawn import run_cases

G = 32  # int4 group size
T = 9  # tokens
FORMATS = ("unquantized", "fp8_block", "fp8_channel", "awq")


def quant_config(fmt: str) -> QuantConfig | None:
    return {"unquantized": None, "fp8_block": Fp8BlockConfig(), "fp8_channel": Fp8ChannelConfig(),
            "awq": AwqConfig(G)}[fmt]


def projection(fmt: str, n: int, k: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One expert projection's checkpoint tensors [n outputs, k inputs] in `fmt`'s layout."""
    w = torch.randn(n, k, generator=g) * 0.1
    if fmt == "unquantized":
        return {"weight": w}
    if fmt == "fp8_block":
        return fp8_block_tensors(w, torch.bfloat16)
    if fmt == "fp8_channel":
        return fp8_channel_tensors(w, torch.bfloat16)
    q = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // G), generator=g)
    return awq_tensors(q, zeros, torch.rand(n, k // G, generator=g) * 0.05 + 0.001)


def experts_checkpoint(fmt: str, prefix: str, E: int, H: int, I: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for e in range(E):
        for proj, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            for suffix, t in projection(fmt, n, k, g).items():
                tensors[f"{prefix}.{e}.{proj}.{suffix}"] = t
    return tensors


def load(module: torch.nn.Module, tensors: dict[str, torch.Tensor], root: str = "") -> None:
    """Every checkpoint tensor through the loaders of `module` (named `root`); the names must
    match exactly."""
    loaders = {}
    for prefix, sub in module.named_modules(prefix=root):
        if hasattr(sub, "checkpoint_tensors"):
            loaders.update(sub.checkpoint_tensors(prefix))
    assert set(loaders) == set(tensors), sorted(set(loaders) ^ set(tensors))[:6]
    for name, t in tensors.items():
        loaders[name](t)
    for sub in module.modules():  # the quantized Linears' conversion after loading
        if hasattr(sub, "method"):
            sub.method.process_weights_after_loading(sub)


def build_experts(parallel: Parallel, fmt: str, E: int, H: int, I: int) -> FusedExperts:
    with building_parallel(parallel), building_with(quant_config(fmt)):
        experts = FusedExperts(E, H, I)
    load(experts, experts_checkpoint(fmt, "experts", E, H, I, seed=1), root="experts")
    return experts


def routed(E: int, H: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    weights, ids = route(torch.randn(T, E, generator=g), top_k, renormalize=False)
    return x, weights, ids


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not torch.equal(want, torch.zeros_like(want))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def experts_case(tp: GroupCoordinator, fmt: str, expert_parallel: bool, E: int, H: int, I: int,
                 top_k: int = 3) -> None:
    one = build_experts(SINGLE, fmt, E, H, I)
    mine = build_experts(Parallel(tp, expert_parallel), fmt, E, H, I)
    if expert_parallel:
        assert mine.local_experts < E and mine.local_width == I
    else:
        assert mine.local_experts == E and mine.local_width == I // tp.size
    x, weights, ids = routed(E, H, top_k, seed=2)
    close(tp.all_reduce(mine(x, weights, ids)), one(x, weights, ids))


# (format, E, H, I): fp8 block's per-rank width 192 at tp 2 and 96 at tp 4 (neither a multiple of 128)
SHAPES = {"unquantized": (6, 64, 96), "fp8_block": (4, 128, 384), "fp8_channel": (4, 64, 96),
          "awq": (4, 128, 128)}


def tp_case(fmt: str):
    return lambda tp: experts_case(tp, fmt, False, *SHAPES[fmt])


def ep_case(fmt: str):
    # 7 experts: 4 + 3 over 2 ranks, 2 + 2 + 2 + 1 over 4
    return lambda tp: experts_case(tp, fmt, True, 7, *SHAPES[fmt][1:])


def dummy_case(tp: GroupCoordinator, fmt: str, expert_parallel: bool) -> None:
    """Dummy weights under tp / ep are the one-rank layer's, each rank its part (load_unsharded)."""
    E, H, I = SHAPES[fmt]
    layers = []
    for parallel in (SINGLE, Parallel(tp, expert_parallel)):
        with building_parallel(parallel), building_with(quant_config(fmt)):
            layers.append(FusedExperts(E, H, I))
    one, mine = layers
    init_dummy_weights(one, std=0.1)
    init_dummy_weights(mine, std=0.1, unsharded=one)
    x, weights, ids = routed(E, H, 3, seed=9)
    want = one(x, weights, ids)  # random int4 words make outputs of hundreds: fp32 order's error
    got = tp.all_reduce(mine(x, weights, ids))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def fp8_block_rank_blocks_case(tp: GroupCoordinator) -> None:
    """The rank's scales are in blocks dividing its width (64 at 192 a rank, 32 at 96)."""
    with building_parallel(Parallel(tp)), building_with(Fp8BlockConfig()):
        experts = FusedExperts(4, 128, 384)
    b = {2: 64, 4: 32}[tp.size]
    assert experts.fp8.block_size == (b, b) and experts.fp8.checkpoint_block == (128, 128)
    assert tuple(experts.w13_scale.shape) == (4, 2 * (384 // tp.size) // b, 128 // b)


def refusals_case(tp: GroupCoordinator) -> None:
    with building_parallel(Parallel(tp)):
        with pytest.raises(ValueError, match="divide the experts' width"):
            FusedExperts(4, 64, 97)  # odd: no whole split
    with building_parallel(Parallel(tp, expert_parallel=True)):
        with pytest.raises(ValueError, match="at least as many experts"):
            FusedExperts(tp.size - 1, 64, 96)
    with building_parallel(Parallel(tp)), building_with(AwqConfig(64)):
        with pytest.raises(ValueError, match="group size 64"):
            FusedExperts(4, 128, 64 * tp.size + 32 * tp.size)  # a rank's width holds no whole groups


def block_case(tp: GroupCoordinator, expert_parallel: bool) -> None:
    """Qwen2-MoE's block with its shared expert and gate: the router replicated, the shared
    expert split column / row, the routed experts split by width or by expert."""
    E, H, I, S = 7, 64, 32, 80
    g = torch.Generator().manual_seed(3)
    tensors = experts_checkpoint("unquantized", "experts", E, H, I, seed=4)
    tensors["gate.weight"] = torch.randn(E, H, generator=g)
    tensors["shared_expert_gate.weight"] = torch.randn(1, H, generator=g)
    for proj, shape in (("gate_proj", (S, H)), ("up_proj", (S, H)), ("down_proj", (H, S))):
        tensors[f"shared_expert.{proj}.weight"] = torch.randn(*shape, generator=g) * 0.1
    blocks = []
    for parallel in (SINGLE, Parallel(tp, expert_parallel)):
        with building_parallel(parallel):
            block = SparseMoeBlock(H, E, 3, I, norm_topk_prob=False, shared_expert_intermediate_size=S)
        load(block, tensors)
        blocks.append(block)
    one, mine = blocks
    x = torch.randn(T, H, generator=g)
    assert not mine.fuses(x[:1])
    close(tp.all_reduce(mine(x)), one(x))


CASES: dict[str, tuple[str, int]] = {}
for size in (2, 4):
    for fmt in FORMATS:
        CASES[f"experts-tp-{fmt}-{size}"] = (f"tp_{fmt}", size)
        CASES[f"experts-ep-{fmt}-{size}"] = (f"ep_{fmt}", size)
    for fmt in ("fp8_block", "awq"):
        CASES[f"dummy-tp-{fmt}-{size}"] = (f"dummy_tp_{fmt}", size)
        CASES[f"dummy-ep-{fmt}-{size}"] = (f"dummy_ep_{fmt}", size)
    CASES[f"fp8-block-rank-blocks-tp{size}"] = ("fp8_block_rank_blocks_case", size)
    CASES[f"refusals-{size}"] = ("refusals_case", size)
    CASES[f"shared-expert-block-tp{size}"] = ("block_tp", size)
    CASES[f"shared-expert-block-ep{size}"] = ("block_ep", size)
for fmt in FORMATS:  # module-level names the spawned processes import
    globals()[f"tp_{fmt}"] = tp_case(fmt)
    globals()[f"ep_{fmt}"] = ep_case(fmt)
    globals()[f"dummy_tp_{fmt}"] = lambda tp, fmt=fmt: dummy_case(tp, fmt, False)
    globals()[f"dummy_ep_{fmt}"] = lambda tp, fmt=fmt: dummy_case(tp, fmt, True)
block_tp = lambda tp: block_case(tp, False)  # noqa: E731
block_ep = lambda tp: block_case(tp, True)  # noqa: E731


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    return run_cases(__name__, CASES, world_size=4)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_moe_matches_one_rank(results, case):
    assert results[case] is None, results[case]
