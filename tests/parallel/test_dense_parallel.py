"""The dense decoder under tensor parallelism: the tiny dense checkpoints (GQA with KV heads
split and replicated, MHA, tied and untied embeddings, a vocabulary that does not split evenly),
an AWQ and an fp8 block-scaled one (made with hotpath/quantizer; a rank's k/v width not a multiple
of 128) and a dummy-weights model, built and loaded under tp = 2 and 4 in real gloo groups: a
prefill of two sequences and decode steps after it give the one-rank model's logits (up to fp32
summation order) and the same argmax, through poisoned paged KV caches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hotpath.distributed.parallel_state import GroupCoordinator
from hotpath.layers.forward_batch import ForwardBatch
from hotpath.layers.quant.detect import read_quant_config
from hotpath.loader.model_loader import load_model
from hotpath.models.registry import read_config
from hotpath.quantizer.quantize import QuantizeOptions, quantize
from paged_step import paged_step
from spawn import parallel, run_cases
from tiny_models import make_tiny_model

BLOCK = 4
NUM_BLOCKS = 8
MAX_POSITIONS = 64
CPU = torch.device("cpu")
TABLES = [[5, 1, 7], [0, 6, 2]]  # each sequence's cache blocks, out of order
PROMPTS = (7, 5)
DECODES = 3
DENSE = ("qwen2-gqa4-tied", "qwen3-gqa8-untied-hd", "llama-mha-untied-llama3rope")
# hidden 256, 8 heads of 64 (q 512: whole 128-column blocks per rank for o_proj at tp 4), 2 KV
# heads (k / v 128 rows: 64 a rank at tp 2 and, replicated, at tp 4), intermediate 512
FP8_CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, vocab_size=512, tie_word_embeddings=False,
                  max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)


def load(path: str, tp: GroupCoordinator | None, load_format: str = "auto") -> torch.nn.Module:
    cfg = read_config(Path(path))
    cfg.quantization = read_quant_config(Path(path), None)
    if tp is None:
        return load_model(cfg, Path(path), load_format, CPU, torch.float32, MAX_POSITIONS)
    with parallel(tp):
        return load_model(cfg, Path(path), load_format, CPU, torch.float32, MAX_POSITIONS)


def bind_poisoned(model: torch.nn.Module) -> None:
    for layer in model.cache_layers():
        k, v = layer.cache_spec().allocate(NUM_BLOCKS, BLOCK, torch.float32, CPU)
        k.fill_(float("nan"))
        v.fill_(float("nan"))
        layer.bind_cache((k, v))


def step(rows: list[tuple[int, int]]) -> tuple[torch.Tensor, ForwardBatch]:
    """Positions and batch of a step in which sequence i brings rows[i] = (start, n) tokens."""
    return paged_step(rows, TABLES, BLOCK)


def logits(model: torch.nn.Module, ids: torch.Tensor, rows: list[tuple[int, int]]) -> torch.Tensor:
    positions, batch = step(rows)
    hidden = model(ids, positions, batch)
    return model.compute_logits(hidden[batch.logits_indices])  # [seqs, vocab] fp32


def generate(model: torch.nn.Module) -> list[torch.Tensor]:
    """Each step's logits [seqs, vocab]: the prompts, then greedy decode steps."""
    bind_poisoned(model)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (sum(PROMPTS),), generator=torch.Generator().manual_seed(7))
    rows = [(0, n) for n in PROMPTS]
    out = []
    for _ in range(DECODES + 1):
        out.append(logits(model, ids, rows))
        ids = out[-1].argmax(-1)  # the next step decodes each sequence's token
        rows = [(start + n, 1) for start, n in rows]
    return out


def model_case(tp: GroupCoordinator, paths: dict[str, str], references: dict[str, list[torch.Tensor]],
               name: str, load_format: str = "auto") -> None:
    key = name if load_format == "auto" else f"{name}-{load_format}"
    want = references[key]  # the one-rank model's, computed once by the test process
    got = generate(load(paths[name], tp, load_format))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"{key} step {i}")
        assert torch.equal(g.argmax(-1), w.argmax(-1)), f"{key} step {i}"


CASES: dict[str, tuple[str, int]] = {}
for size in (2, 4):
    for name in (*DENSE, "awq", "fp8-block"):
        CASES[f"{name}-tp{size}"] = (f"case_{name.replace('-', '_')}", size)
    CASES[f"dummy-fp8-block-tp{size}"] = ("case_dummy", size)
for name in (*DENSE, "awq", "fp8-block"):  # module-level names the spawned processes import
    globals()[f"case_{name.replace('-', '_')}"] = (
        lambda tp, paths, refs, name=name: model_case(tp, paths, refs, name))


def case_dummy(tp: GroupCoordinator, paths: dict[str, str], references: dict[str, list[torch.Tensor]]) -> None:
    """Random weights (fp8 block-scaled layout, re-blocked k/v): every tp size the same model."""
    model_case(tp, paths, references, "fp8-block", load_format="dummy")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, str | None]:
    paths = {}
    for name in DENSE:
        out = tmp_path_factory.mktemp(name)
        # a vocabulary of 510 does not split over 4 ranks: the padding rows are never chosen
        make_tiny_model(name, out, vocab_size=510 if name == "qwen2-gqa4-tied" else 512)
        paths[name] = str(out)
    # AWQ groups of 16: a rank's o_proj / down_proj inputs at tp 4 are 16 / 32 columns
    paths["awq"] = str(quantize(paths["llama-mha-untied-llama3rope"], tmp_path_factory.mktemp("awq") / "q",
                                QuantizeOptions(method="awq", group_size=16, calibration="random",
                                                num_samples=2, seq_len=16, clip=False,
                                                scale_search=False)))
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    source = tmp_path_factory.mktemp("fp8-source")
    Qwen3ForCausalLM(Qwen3Config(**FP8_CONFIG)).save_pretrained(source)
    paths["fp8-block"] = str(quantize(str(source), tmp_path_factory.mktemp("fp8") / "q",
                                      QuantizeOptions(method="fp8-block")))
    references = {name: generate(load(path, None)) for name, path in paths.items()}
    references["fp8-block-dummy"] = generate(load(paths["fp8-block"], None, "dummy"))
    assert not torch.equal(references["fp8-block-dummy"][0], references["fp8-block"][0])
    return run_cases(__name__, CASES, world_size=4, args=(paths, references))


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_model_matches_one_rank(results, case):
    assert results[case] is None, results[case]
