"""Gated DeltaNet and the tiny MoE / hybrid models under tensor and expert parallelism, against the
same layer or model on one rank, in real gloo groups of 2 and 4 processes.

The layer: heads split over the ranks in both checkpoint layouts (Qwen3-Next's interleaved
in_proj_qkvz / in_proj_ba, Qwen3.5's flat in_proj_qkv / z / b / a), each rank's state slots
sized from its heads; a prefill of two sequences, a chunked continuation and decode steps, the
ranks' outputs summed (the decoder's all-reduce) equal to the one-rank layer's at every step, so
the per-rank conv and recurrent states carry the right heads. The models: prefill + greedy decode
logits equal the one-rank model's (fp32), through poisoned caches."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from hotpath.distributed.parallel_state import SINGLE, GroupCoordinator, Parallel, building_parallel
from hotpath.layers.cache import KVCacheSpec
from hotpath.layers.forward_batch import ForwardBatch
from hotpath.layers.gated_delta import GatedDeltaNet
from hotpath.loader.model_loader import load_model, load_mtp
from hotpath.models.registry import read_config
from paged_step import paged_step
from spawn import run_cases
from tiny_models import make_tiny_model

CPU = torch.device("cpu")
H, NK, NV, DK, DV, CONV = 64, 4, 8, 16, 8, 4
SLOTS = (2, 0)  # each sequence's state slot, out of order
BLOCK, NUM_BLOCKS = 4, 8
TABLES = [[5, 1, 7, 3], [0, 6, 2, 4]]  # each sequence's KV blocks, out of order
MAX_POSITIONS = 64


def step(rows: list[tuple[int, int]]) -> tuple[torch.Tensor, ForwardBatch]:
    """Positions and batch of a step in which sequence i brings rows[i] = (start, n) tokens."""
    return paged_step(rows, TABLES, BLOCK, SLOTS)


# prefill (7 and 5 tokens from position 0), a chunk after them, then three decode steps
STEPS = [[(0, 7), (0, 5)], [(7, 4), (5, 3)], [(11, 1), (8, 1)], [(12, 1), (9, 1)], [(13, 1), (10, 1)]]


def bind_poisoned(layers: list[torch.nn.Module]) -> None:
    """Caches full of NaN: a fresh sequence's state slot must be zeroed by the layer itself."""
    for layer in layers:
        spec = layer.cache_spec()
        if isinstance(spec, KVCacheSpec):
            caches = spec.allocate(NUM_BLOCKS, BLOCK, torch.float32, CPU)
        else:
            caches = spec.allocate(3, torch.float32, CPU)
        for t in caches:
            t.fill_(float("nan"))
        if isinstance(spec, KVCacheSpec):
            layer.bind_cache(caches)
        else:
            layer.bind_cache(caches, spec.allocate(1, torch.float32, CPU))


# ---- the layer -----------------------------------------------------------------------------------
def layer_checkpoint(layout: str, g: torch.Generator) -> dict[str, torch.Tensor]:
    key, value, per = NK * DK, NV * DV, NV // NK

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    if layout == "qwen3_next":
        tensors = {"in_proj_qkvz.weight": w(NK * (2 * DK + 2 * per * DV), H), "in_proj_ba.weight": w(NK * 2 * per, H)}
    else:
        tensors = {"in_proj_qkv.weight": w(2 * key + value, H), "in_proj_z.weight": w(value, H),
                   "in_proj_b.weight": w(NV, H), "in_proj_a.weight": w(NV, H)}
    return tensors | {"conv1d.weight": w(2 * key + value, 1, CONV), "dt_bias": w(NV), "A_log": w(NV),
                      "norm.weight": 1 + w(DV), "out_proj.weight": w(H, value)}


def load_layer(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor through the layer's loaders, as CheckpointLoading finds them."""
    loaders = {}
    for prefix, module in layer.named_modules(prefix="linear_attn"):
        if hasattr(module, "checkpoint_tensors"):
            loaders.update(module.checkpoint_tensors(prefix))
            continue
        for name, param in module.named_parameters(prefix=prefix, recurse=False):
            loaders[name] = lambda t, p=param: p.data.copy_(t)
    assert set(loaders) == {f"linear_attn.{n}" for n in tensors}, sorted(loaders)
    for name, t in tensors.items():
        loaders[f"linear_attn.{name}"](t)


def gated_delta_case(tp: GroupCoordinator, layout: str) -> None:
    """Prefill, a chunk and decode steps; states per rank from its heads."""
    tensors = layer_checkpoint(layout, torch.Generator().manual_seed(5))
    layers = []
    for parallel in (SINGLE, Parallel(tp)):
        with building_parallel(parallel):
            layer = GatedDeltaNet(H, NK, NV, DK, DV, CONV, 1e-6, layout=layout)
        load_layer(layer, tensors)
        bind_poisoned([layer])
        layers.append(layer)
    one, mine = layers
    spec = mine.cache_spec()
    assert (spec.num_v_heads, spec.conv_dim) == (NV // tp.size, (2 * NK * DK + NV * DV) // tp.size)
    g = torch.Generator().manual_seed(6)
    for i, rows in enumerate(STEPS):
        positions, batch = step(rows)
        x = torch.randn(positions.shape[0], H, generator=g)
        want = one(positions, x, batch)
        got = tp.all_reduce(mine(positions, x, batch))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{layout} step {i}")
        assert not mine.fuses(x[:1])


def gated_delta_refusal(tp: GroupCoordinator, paths: dict[str, str]) -> None:
    with building_parallel(Parallel(tp)):
        with pytest.raises(ValueError, match="divide the Gated DeltaNet's 2 key heads"):
            GatedDeltaNet(H, 2, 4, DK, DV, CONV, 1e-6)


# ---- whole models --------------------------------------------------------------------------------
def load(path: str, parallel: Parallel, load_format: str = "auto") -> torch.nn.Module:
    cfg = read_config(Path(path))
    with building_parallel(parallel):
        return load_model(cfg, Path(path), load_format, CPU, torch.float32, MAX_POSITIONS)


def run_model(model: torch.nn.Module, first_ids: torch.Tensor, next_ids: list[torch.Tensor] | None = None
              ) -> list[torch.Tensor]:
    """Logits [seqs, vocab] of each of MODEL_STEPS: a prefill, then decode steps of the tokens
    `next_ids` gives (None: each step's argmax, greedy)."""
    bind_poisoned(model.cache_layers())
    ids, out = first_ids, []
    for i, rows in enumerate(MODEL_STEPS):
        positions, batch = step(rows)
        out.append(model.compute_logits(model(ids, positions, batch)[batch.logits_indices]))
        ids = out[-1].argmax(-1) if next_ids is None else next_ids[i]
    return out


@functools.cache
def one_rank_logits(path: str, load_format: str = "auto") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The prompt and the one-rank model's logits at each step (computed once a process)."""
    model = load(path, SINGLE, load_format)
    ids = torch.randint(0, model.config.vocab_size, (12,), generator=torch.Generator().manual_seed(7))
    return ids, run_model(model, ids)


def model_case(tp: GroupCoordinator, paths: dict[str, str], name: str, expert_parallel: bool,
               load_format: str = "auto") -> None:
    ids, want = one_rank_logits(paths[name], load_format)
    got = run_model(load(paths[name], Parallel(tp, expert_parallel), load_format), ids,
                    [w.argmax(-1) for w in want])
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"{name} step {i}")
        assert torch.equal(g.argmax(-1), w.argmax(-1)), f"{name} step {i}"


def mtp_case(tp: GroupCoordinator, paths: dict[str, str], name: str) -> None:
    """The checkpoint's MTP head beside its target under tp: its draft logits over a prefill's
    rows and a draft step after it (its own output fed back) equal the one-rank head's."""
    path = Path(paths[name])
    outs = []
    for parallel in (SINGLE, Parallel(tp)):
        cfg = read_config(path)
        with building_parallel(parallel):
            target = load_model(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS)
            head = load_mtp(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS, 0, target)
        bind_poisoned(target.cache_layers())
        bind_poisoned(head.cache_layers())
        g = torch.Generator().manual_seed(8)
        ids = torch.randint(0, cfg.vocab_size, (12,), generator=g)
        positions, batch = step(MODEL_STEPS[0])
        hidden = target(ids, positions, batch)
        shifted = torch.randint(0, cfg.vocab_size, (12,), generator=g)  # the tokens after each row
        out = head(shifted, positions, batch, hidden)[batch.logits_indices]
        logits = [head.compute_logits(out)]
        positions, batch = step(MODEL_STEPS[1])
        logits.append(head.compute_logits(head(logits[0].argmax(-1), positions, batch, out, step=1)))
        outs.append(logits)
    for i, (want, got) in enumerate(zip(*outs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{name} mtp draft {i}")
        assert torch.equal(got.argmax(-1), want.argmax(-1))


MTP_MODELS = ("qwen3next-hybrid", "qwen3_5-moe")  # their checkpoints carry a one-layer MTP head
MODEL_STEPS = [[(0, 7), (0, 5)], [(7, 1), (5, 1)], [(8, 1), (6, 1)]]  # a prefill, decode steps
MODELS = {  # name: the tp sizes its heads allow
    "qwen3moe-e7-top3-sparse2": (2, 4), "qwen2moe-shared": (2, 4), "qwen3next-hybrid": (2,),
    "qwen3_5-moe": (2,)}

CASES: dict[str, tuple[str, int]] = {}
for size in (2, 4):
    for layout in ("qwen3_next", "qwen3_5"):
        CASES[f"gated-delta-{layout}-tp{size}"] = (f"gated_delta_{layout}", size)
    for name, sizes in MODELS.items():
        if size in sizes:
            for mode in ("tp", "ep"):
                CASES[f"{name}-{mode}{size}"] = (f"model_{name.replace('-', '_')}_{mode}", size)
for name in MTP_MODELS:
    CASES[f"{name}-mtp-tp2"] = (f"mtp_{name.replace('-', '_')}", 2)
    globals()[f"mtp_{name.replace('-', '_')}"] = lambda tp, paths, name=name: mtp_case(tp, paths, name)
CASES["qwen3_5-moe-dummy-tp2"] = ("dummy_qwen3_5_moe", 2)  # random weights: the same model at every tp


def dummy_qwen3_5_moe(tp: GroupCoordinator, paths: dict[str, str]) -> None:
    model_case(tp, paths, "qwen3_5-moe", False, load_format="dummy")


for layout in ("qwen3_next", "qwen3_5"):  # module-level names the spawned processes import
    globals()[f"gated_delta_{layout}"] = lambda tp, paths, layout=layout: gated_delta_case(tp, layout)
for name in MODELS:
    for mode in ("tp", "ep"):
        globals()[f"model_{name.replace('-', '_')}_{mode}"] = (
            lambda tp, paths, name=name, ep=mode == "ep": model_case(tp, paths, name, ep))


CASES["gated-delta-refusal-tp4"] = ("gated_delta_refusal", 4)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, str | None]:
    paths = {}
    for name in MODELS:
        out = tmp_path_factory.mktemp(name)
        make_tiny_model(name, out, mtp_layers=1 if name in MTP_MODELS else 0)
        paths[name] = str(out)
    return run_cases(__name__, CASES, world_size=4, args=(paths,))


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_hybrid_matches_one_rank(results, case):
    assert results[case] is None, results[case]
