"""Column-, row- and QKV-parallel Linear layers in every quant method against the same layer on
one rank, in real gloo groups of 2 and 4 processes: each rank loads the full checkpoint tensors
(published layouts, written by hotpath/quantizer/formats.py) into its shard, runs random inputs,
and its outputs (gathered, or reduced for row layers) equal the one-rank layer's."""

from __future__ import annotations

import pytest
import torch

from hotpath.distributed.parallel_state import GroupCoordinator
from hotpath.layers.linear import Linear, QKVLinear
from hotpath.layers.quant.awq import AwqConfig
from hotpath.layers.quant.base import QuantConfig, building_with
from hotpath.layers.quant.fp8_block import Fp8BlockConfig
from hotpath.layers.quant.fp8_channel import Fp8ChannelConfig, Fp8OnlineConfig
from hotpath.layers.quant.gptq import GptqConfig
from hotpath.quantizer.formats import awq_tensors, fp8_block_tensors, fp8_channel_tensors, gptq_tensors
from spawn import parallel, run_cases

G = 32  # int4 group size
# fp8_online: a 16-bit checkpoint quantized per row as it loads (quantization="fp8")
FORMATS = ("unquantized", "fp8_channel", "fp8_online", "fp8_block", "awq", "gptq", "gptq_act_order")
PER_TOKEN_FP8 = ("fp8_channel", "fp8_online")


def quant_config(fmt: str) -> QuantConfig | None:
    return {"unquantized": None, "fp8_channel": Fp8ChannelConfig(), "fp8_online": Fp8OnlineConfig(),
            "fp8_block": Fp8BlockConfig(),
            "awq": AwqConfig(G), "gptq": GptqConfig(G), "gptq_act_order": GptqConfig(G)}[fmt]


def checkpoint(fmt: str, n: int, k: int, g: torch.Generator, g_idx: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
    """One projection's checkpoint tensors [n outputs, k inputs] in `fmt`'s published layout."""
    w = torch.randn(n, k, generator=g) * 0.1
    if fmt in ("unquantized", "fp8_online"):
        return {"weight": w}
    if fmt == "fp8_channel":
        return fp8_channel_tensors(w, torch.bfloat16)
    if fmt == "fp8_block":
        return fp8_block_tensors(w, torch.bfloat16)
    q = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // G), generator=g)
    scales = torch.rand(n, k // G, generator=g) * 0.05 + 0.001
    if fmt == "awq":
        return awq_tensors(q, zeros, scales)
    if g_idx is None:
        g_idx = torch.arange(k) // G
    return gptq_tensors(q, zeros, scales, g_idx)


def act_order_g_idx(k: int, g: torch.Generator, blocks: int = 1) -> torch.Tensor:
    """GPTQ desc_act's g_idx: the groups over a permutation of the columns, within each of
    `blocks` equal runs of columns (blocks = tp: every rank's columns hold whole groups)."""
    width = k // blocks
    g_idx = torch.empty(k, dtype=torch.long)
    for b in range(blocks):
        perm = torch.randperm(width, generator=g) + b * width
        g_idx[perm] = torch.arange(b * width, (b + 1) * width) // G
    return g_idx


def build(fmt: str, tp: GroupCoordinator | None, make) -> Linear:
    with building_with(quant_config(fmt)):
        if tp is None:
            return make()
        with parallel(tp):
            return make()


def poison(layer: Linear) -> None:
    """Parameters NaN (floats; 0x7f is e4m3's NaN) or random words before loading: a part the
    loaders leave unfilled shows in the outputs."""
    for p in layer.parameters():
        if p.dtype.is_floating_point and p.element_size() == 1:
            p.data.view(torch.uint8).fill_(0x7F)
        elif p.dtype.is_floating_point:
            p.data.fill_(float("nan"))
        else:
            p.data.random_(-2**31, 2**31 - 1)


def load(layer: Linear, tensors: dict[str, torch.Tensor]) -> Linear:
    poison(layer)
    loaders = layer.checkpoint_tensors("blk.proj")
    assert set(loaders) == set(tensors), (sorted(loaders), sorted(tensors))
    for name, t in tensors.items():
        loaders[name](t)
    layer.method.process_weights_after_loading(layer)
    return layer


def projection_tensors(fmt: str, names: list[str], sizes: list[int], k: int, bias: bool,
                       g_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # the same tensors on every rank
    if fmt == "gptq_act_order" and g_idx is None:
        g_idx = act_order_g_idx(k, g)
    tensors = {}
    for name, n in zip(names, sizes):
        for suffix, t in checkpoint(fmt.removesuffix("_act_order"), n, k, g, g_idx).items():
            tensors[f"blk.{name}.{suffix}"] = t
        if bias:
            tensors[f"blk.{name}.bias"] = torch.randn(n, generator=g)
    return tensors


def inputs(rows: int, k: int) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(99))


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


# ---- cases (run on every rank of a group) --------------------------------------------------------
def column_case(fmt: str, tp: GroupCoordinator, sizes: list[int] = (384, 256), k: int = 256) -> None:
    """gate_up-like: each projection's outputs split; the rank's outputs are its slice of each."""
    names = ["gate_proj", "up_proj"]
    make = lambda: Linear(k, list(sizes), checkpoint_names=names, parallel="column")  # noqa: E731
    tensors = projection_tensors(fmt, names, list(sizes), k, bias=False)
    full, part = load(build(fmt, None, make), tensors), load(build(fmt, tp, make), tensors)
    assert part.output_sizes == [s // tp.size for s in sizes]
    for rows in (2, 7):
        x = inputs(rows, k)
        want, got = full(x), part(x)
        expected = torch.cat([p[:, tp.rank * (s // tp.size):(tp.rank + 1) * (s // tp.size)]
                              for p, s in zip(want.split(list(sizes), -1), sizes)], -1)
        close(got, expected)
        gathered = tp.all_gather(got)
        assert gathered.shape == (rows, sum(sizes))


def row_case(fmt: str, tp: GroupCoordinator, k: int = 512, n: int = 128) -> None:
    """o_proj-like: inputs split, partial sums reduced; the bias counted once."""
    g_idx = None
    if fmt == "gptq_act_order":  # each rank's columns hold whole groups (see the refusal case)
        g_idx = act_order_g_idx(k, torch.Generator().manual_seed(5), blocks=tp.size)
    bias = fmt == "unquantized"
    make = lambda: Linear(k, [n], bias=bias, parallel="row")  # noqa: E731
    tensors = projection_tensors(fmt, ["proj"], [n], k, bias=bias, g_idx=g_idx)
    full, part = load(build(fmt, None, make), tensors), load(build(fmt, tp, make), tensors)
    assert part.in_features == k // tp.size and not part.fuses(inputs(1, k // tp.size))
    for rows in (2, 7):
        x = inputs(rows, k)
        start = tp.rank * (k // tp.size)
        got = part(x[:, start:start + k // tp.size].contiguous())
        reduced = tp.all_reduce(got.clone())
        want = full(x)
        if fmt in PER_TOKEN_FP8 and rows > 2:
            # the activations quantized per token over the rank's columns (more rows than
            # FP8_GEMV_MAX_ROWS): the same within fp8's precision, not bit for bit
            assert (reduced - want).norm() < 0.05 * want.norm()
            assert not torch.equal(reduced, want)
        else:
            close(reduced, want)


def qkv_case(fmt: str, tp: GroupCoordinator, num_kv_heads: int) -> None:
    """QKV split by heads; KV heads replicated when tp > num_kv_heads."""
    heads, head_dim, hidden = 8, 64, 256  # 2 KV heads of 64: whole fp8 blocks on one rank
    names = ["q_proj", "k_proj", "v_proj"]
    sizes = [heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    make = lambda: QKVLinear(hidden, head_dim, heads, num_kv_heads, bias=True)  # noqa: E731
    tensors = projection_tensors(fmt, names, sizes, hidden, bias=True)
    full, part = load(build(fmt, None, make), tensors), load(build(fmt, tp, make), tensors)
    nq = heads // tp.size
    nkv = max(1, num_kv_heads // tp.size)
    assert (part.num_heads, part.num_kv_heads) == (nq, nkv)
    x = inputs(5, hidden)
    q, k, v = full(x).split(sizes, -1)
    pq, pk, pv = part(x).split([nq * head_dim, nkv * head_dim, nkv * head_dim], -1)
    close(pq, q[:, tp.rank * nq * head_dim:(tp.rank + 1) * nq * head_dim])
    # the KV head(s) this rank's query heads attend with
    kv0 = tp.rank * nq // (heads // num_kv_heads)
    close(pk, k[:, kv0 * head_dim:(kv0 + nkv) * head_dim])
    close(pv, v[:, kv0 * head_dim:(kv0 + nkv) * head_dim])


def fp8_block_unaligned_case(tp: GroupCoordinator) -> None:
    """A rank width that is not a multiple of 128 (1536 / 8 = 192 in Qwen3-235B; here 384 / 2 and
    / 4): the scales are re-blocked, the outputs the same."""
    column_case("fp8_block", tp, sizes=(384, 384 + 128 * tp.size), k=384)
    layer = build("fp8_block", tp, lambda: Linear(384, [384], parallel="column"))
    assert layer.method.block_size[0] < 128 and (384 // tp.size) % layer.method.block_size[0] == 0


def refusals_case(tp: GroupCoordinator) -> None:
    """Splits that cannot hold are refused at construction (or at load), naming the sizes."""
    for make, fmt, words in [
        (lambda: Linear(G * tp.size + 8 * tp.size, [64], parallel="row"), "awq", "group"),
        (lambda: Linear(128 * tp.size - 64 * tp.size, [128], parallel="row"), "fp8_block", "128-column"),
        (lambda: Linear(64, [8 * tp.size + 1], parallel="column"), "unquantized", "split evenly"),
        (lambda: QKVLinear(64, 16, 2 * tp.size + 1, 1), "unquantized", "attention heads"),
        (lambda: QKVLinear(64, 16, 12, 3), "unquantized", "KV heads"),
    ]:
        with pytest.raises(ValueError, match=words):
            build(fmt, tp, make)
    # act-order groups straddling ranks: the int4 layout needs whole groups on a rank
    k = 64 * tp.size
    make = lambda: Linear(k, [64], parallel="row")  # noqa: E731
    g_idx = act_order_g_idx(k, torch.Generator().manual_seed(3))
    layer = build("gptq_act_order", tp, make)
    with pytest.raises(ValueError, match="act-order"):
        load(layer, projection_tensors("gptq_act_order", ["proj"], [64], k, False, g_idx))


def _case(fn, *args):
    return lambda tp: fn(*args, tp) if args else fn(tp)


CASES: dict[str, tuple[str, int]] = {}
for size in (2, 4):
    for fmt in FORMATS:
        CASES[f"column-{fmt}-tp{size}"] = (f"column_{fmt}", size)
        CASES[f"row-{fmt}-tp{size}"] = (f"row_{fmt}", size)
        CASES[f"qkv-kv2-{fmt}-tp{size}"] = (f"qkv_kv2_{fmt}", size)  # tp >= kv heads: replicated at 4
        CASES[f"qkv-kv8-{fmt}-tp{size}"] = (f"qkv_kv8_{fmt}", size)  # tp < kv heads: split
    CASES[f"fp8-block-unaligned-tp{size}"] = ("fp8_block_unaligned_case", size)
    CASES[f"refusals-tp{size}"] = ("refusals_case", size)
for fmt in FORMATS:  # module-level names the spawned processes import
    globals()[f"column_{fmt}"] = _case(column_case, fmt)
    globals()[f"row_{fmt}"] = _case(row_case, fmt)
    globals()[f"qkv_kv2_{fmt}"] = lambda tp, fmt=fmt: qkv_case(fmt, tp, 2)
    globals()[f"qkv_kv8_{fmt}"] = lambda tp, fmt=fmt: qkv_case(fmt, tp, 8)


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    return run_cases(__name__, CASES, world_size=4)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_linear_matches_one_rank(results, case):
    assert results[case] is None, results[case]
