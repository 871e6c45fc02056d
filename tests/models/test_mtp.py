"""The multi-token-prediction head (hotpath/models/mtp.py) against a reference built from HF
transformers' own classes (the model family's full-attention decoder layer and zero-centred RMSNorm,
loaded with the checkpoint's mtp.layers.0 weights; fc and the concatenation as vLLM's MTP files
apply them), on tiny checkpoints written with mtp.* tensors (tiny_models.add_mtp_weights); CPU,
fp32, the reference ops, paged K/V caches filled with NaN where nothing was written.

Also: the errors for a model without an MTP head, the target loading and running as before with
the head beside it (sharing, not copying, its embedding and LM head), the fused-experts layout,
and random (dummy) weights."""

from __future__ import annotations

import logging

import pytest
import torch

from hotpath.layers.cache import KVCacheSpec, StateCacheSpec
from hotpath.loader.model_loader import load_model, load_mtp
from hotpath.models.registry import read_config
from hotpath.layers.forward_batch import ForwardBatch
from mtp_reference import hf_reference, mtp_tensors
from tiny_models import make_tiny_model

BLOCK = 4
NUM_BLOCKS = 12
MAX_POSITIONS = 256
CPU = torch.device("cpu")
HYBRIDS = ["qwen3next-hybrid", "qwen3_5-dense", "qwen3_5-moe", "qwen3_5-image-text"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(name, fused experts) -> (checkpoint dir, HF model), written once per module; (name, None):
    the same checkpoint without an MTP head."""
    cache = {}

    def get(name: str, fused: bool | None = False):
        key = (name, fused)
        if key not in cache:
            out = tmp_path_factory.mktemp(name)
            mtp = 0 if fused is None else 1
            cache[key] = (out, make_tiny_model(name, out, mtp_layers=mtp, fused_mtp_experts=bool(fused)))
        return cache[key]

    return get


def _load(path, load_format: str = "auto"):
    cfg = read_config(path)
    target = load_model(cfg, path, load_format, CPU, torch.float32, MAX_POSITIONS)
    mtp = load_mtp(cfg, path, load_format, CPU, torch.float32, MAX_POSITIONS, 0, target)
    return cfg, target, mtp


def _bind_poisoned(layers) -> None:
    """K/V caches (and any state slots) full of NaN: a read of a slot nothing wrote shows."""
    for layer in layers:
        spec = layer.cache_spec()
        if isinstance(spec, KVCacheSpec):
            k, v = spec.allocate(NUM_BLOCKS + 1, BLOCK, torch.float32, CPU)
            k.fill_(float("nan"))
            v.fill_(float("nan"))
            layer.bind_cache((k, v))
        else:
            assert isinstance(spec, StateCacheSpec)
            layer.bind_cache(spec.allocate(4, torch.float32, CPU), spec.allocate(0, torch.float32, CPU))


def _step(rows: list[tuple[int, int]], tables: list[list[int]]) -> tuple[torch.Tensor, ForwardBatch]:
    """Positions and batch of a step in which sequence i brings rows[i] = (start, n) tokens, its
    K/V in the blocks tables[i] (as the engine builds them)."""
    cu, slots, positions = [0], [], []
    for (start, n), table in zip(rows, tables):
        cu.append(cu[-1] + n)
        for p in range(start, start + n):
            positions.append(p)
            slots.append(table[p // BLOCK] * BLOCK + p % BLOCK)
    width = max(len(t) for t in tables)
    i32 = torch.int32
    batch = ForwardBatch(
        cu_query_lens=torch.tensor(cu, dtype=i32),
        context_lens=torch.tensor([s + n for s, n in rows], dtype=i32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=i32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        logits_indices=torch.tensor([c - 1 for c in cu[1:]], dtype=torch.int64),
        max_query_len=max(n for _, n in rows), max_context_len=max(s + n for s, n in rows),
        state_slots=torch.arange(len(rows), dtype=torch.int64), cu_query_lens_host=cu,
    )
    return torch.tensor(positions, dtype=torch.int64), batch


@pytest.mark.parametrize("name", HYBRIDS)
def test_mtp_head_matches_hf_layers(name, checkpoints):
    """Two sequences through the paged cache: a prompt of 11 in two steps (7, then a few-query
    row of 4) beside a prompt of 9 (6, then 3), their blocks out of order; every row equals the
    reference over the whole sequence, and draft-style single rows (hidden fed back) too."""
    path, hf_model = checkpoints(name)
    cfg, target, mtp = _load(path)
    assert mtp.num_layers == 1 and cfg.mtp_num_layers == 1
    _bind_poisoned(mtp.cache_layers())
    g = torch.Generator().manual_seed(7)
    lengths, tables = [12, 9], [[5, 2, 7], [1, 6, 3]]
    ids = [torch.randint(3, cfg.vocab_size, (n,), generator=g) for n in lengths]
    hidden = [torch.randn(n, cfg.hidden_size, generator=g) for n in lengths]
    got = [[], []]
    for split in ([(0, 7), (0, 6)], [(7, 4), (6, 3)], [(11, 1)]):
        positions, batch = _step(split, tables[:len(split)])
        rows = [slice(s, s + n) for s, n in split]
        out = mtp(torch.cat([i[r] for i, r in zip(ids, rows)]), positions, batch,
                  torch.cat([h[r] for h, r in zip(hidden, rows)]))
        assert out.shape == (positions.shape[0], cfg.hidden_size) and torch.isfinite(out).all()
        for i, part in enumerate(out.split([n for _, n in split])):
            got[i].append(part)
    for i, n in enumerate(lengths):
        ref = hf_reference(hf_model, mtp_tensors(path), ids[i], hidden[i])
        torch.testing.assert_close(torch.cat(got[i]), ref, rtol=1e-5, atol=1e-5)
    # logits through the target's LM head
    last = torch.cat([g_[-1][-1:] for g_ in got])
    torch.testing.assert_close(mtp.compute_logits(last), target.compute_logits(last), rtol=0, atol=0)


def test_draft_steps_feed_the_head_its_own_output(checkpoints):
    """Drafts 2 and 3 of a sequence: one row at the next position, the previous draft's token and
    the head's own output as `hidden`: equal to the reference over the sequence so extended."""
    path, hf_model = checkpoints("qwen3next-hybrid")
    cfg, _, mtp = _load(path)
    _bind_poisoned(mtp.cache_layers())
    g = torch.Generator().manual_seed(3)
    n = 6
    ids = torch.randint(3, cfg.vocab_size, (n,), generator=g)
    hidden = torch.randn(n, cfg.hidden_size, generator=g)
    positions, batch = _step([(0, n)], [[4, 0]])
    outs = [mtp(ids, positions, batch, hidden)]
    for k in range(2):
        token = mtp.compute_logits(outs[-1][-1:]).argmax(-1)
        ids, hidden = torch.cat([ids, token]), torch.cat([hidden, outs[-1][-1:]])
        positions, batch = _step([(n + k, 1)], [[4, 0]])
        outs.append(mtp(token, positions, batch, outs[-1][-1:], step=k + 1))
    ref = hf_reference(hf_model, mtp_tensors(path), ids, hidden)
    torch.testing.assert_close(torch.cat(outs), ref, rtol=1e-5, atol=1e-5)


def test_fused_experts_layout_loads_the_same_head(checkpoints):
    """Qwen3.5-MoE experts stored fused (experts.gate_up_proj / down_proj) load to the same
    parameters as one tensor per expert."""
    per_expert, _ = checkpoints("qwen3_5-moe")
    fused, _ = checkpoints("qwen3_5-moe", fused=True)
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in mtp_tensors(fused)
    a, b = _load(per_expert)[2], _load(fused)[2]
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=na)


@torch.no_grad()
def _target_logits(target, cfg, ids: torch.Tensor) -> torch.Tensor:
    _bind_poisoned(target.cache_layers())
    for layer in target.cache_layers():  # state slots start from zero states
        if isinstance(layer.cache_spec(), StateCacheSpec):
            for t in layer.state:
                t.zero_()
    positions, batch = _step([(0, ids.shape[0])], [list(range(NUM_BLOCKS))])
    return target.compute_logits(target(ids, positions, batch))


@pytest.mark.parametrize("name", ["qwen3next-hybrid", "qwen3_5-image-text"])
def test_target_unchanged_beside_its_head(name, checkpoints, caplog):
    """The target loads from a checkpoint with mtp.* as from one without (the head's tensors
    skipped, with a log line), runs the same before and after its head is loaded, and the head
    holds the target's embedding and LM head themselves."""
    path, hf_model = checkpoints(name)
    plain, _ = checkpoints(name, fused=None)
    cfg = read_config(path)
    with caplog.at_level(logging.INFO, logger="hotpath"):
        target = load_model(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS)
    assert "multi-token-prediction head weights (mtp.*)" in caplog.text
    before = {k: v.clone() for k, v in target.state_dict().items()}
    without = load_model(read_config(plain), plain, "auto", CPU, torch.float32, MAX_POSITIONS)
    for k, v in without.state_dict().items():
        torch.testing.assert_close(before[k], v, rtol=0, atol=0, msg=k)
    ids = torch.randint(3, cfg.vocab_size, (10,), generator=torch.Generator().manual_seed(5))
    logits = _target_logits(target, cfg, ids)
    with torch.no_grad():
        ref = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)

    mtp = load_mtp(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS, 0, target)
    assert mtp.embed_tokens is target.model.embed_tokens and mtp.lm_head is target.lm_head
    target_params = {p.data_ptr() for p in target.parameters()}
    assert not target_params & {p.data_ptr() for p in mtp.parameters()}
    assert all(k.split(".")[0] in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "layers", "norm")
               for k in mtp.state_dict())
    for k, v in target.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    torch.testing.assert_close(_target_logits(target, cfg, ids), logits, rtol=0, atol=0)


def test_no_mtp_head_is_a_clear_error(checkpoints):
    path, _ = checkpoints("qwen3_5-dense", fused=None)
    cfg = read_config(path)
    target = load_model(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS)
    with pytest.raises(ValueError, match=r"has no multi-token-prediction head \(mtp\.\* weights\)"):
        load_mtp(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS, 0, target)
    cfg.mtp_num_layers = 0  # a config.json that declares none
    with pytest.raises(ValueError, match=r"has no multi-token-prediction head \(mtp\.\*\): its config"):
        load_mtp(cfg, path, "dummy", CPU, torch.float32, MAX_POSITIONS, 0, target)


def test_no_mtp_head_for_a_family_without_one(checkpoints):
    path, _ = checkpoints("qwen3-gqa8-untied-hd", fused=None)
    cfg = read_config(path)
    target = load_model(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS)
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM has no multi-token-prediction head \(mtp\.\*\)"):
        load_mtp(cfg, path, "auto", CPU, torch.float32, MAX_POSITIONS, 0, target)


def test_dummy_weights(checkpoints):
    """load_format="dummy": random weights at the real shapes, a working head (one layer where
    config.json does not say), the target's embedding untouched."""
    path, _ = checkpoints("qwen3next-hybrid", fused=None)
    cfg = read_config(path)
    assert cfg.mtp_num_layers is None
    target = load_model(cfg, path, "dummy", CPU, torch.float32, MAX_POSITIONS, seed=1)
    embed = target.model.embed_tokens.weight.clone()
    mtp = load_mtp(cfg, path, "dummy", CPU, torch.float32, MAX_POSITIONS, 1, target)
    assert mtp.num_layers == 1 and torch.equal(target.model.embed_tokens.weight, embed)
    assert mtp.fc.weight.std() > 0 and torch.isfinite(mtp.fc.weight).all()
    _bind_poisoned(mtp.cache_layers())
    g = torch.Generator().manual_seed(2)
    positions, batch = _step([(0, 5)], [[3, 1]])
    out = mtp(torch.randint(3, cfg.vocab_size, (5,), generator=g), positions, batch,
              torch.randn(5, cfg.hidden_size, generator=g))
    assert torch.isfinite(mtp.compute_logits(out)).all()


def test_quantized_checkpoint_with_a_16_bit_head(checkpoints, tmp_path):
    """A checkpoint quantized to fp8 with its mtp.* tensors left in 16 bits (as hotpath's own
    quantizer writes them): the target's layers run fp8, the head's load in the model dtype."""
    from hotpath.layers.linear import UnquantizedLinearMethod
    from hotpath.layers.quant.detect import read_quant_config
    from hotpath.quantizer.fp8 import quantize_fp8

    path, _ = checkpoints("qwen3next-hybrid")
    quantize_fp8(path, tmp_path, "fp8-ptpc", torch.float32, CPU)
    cfg = read_config(tmp_path)
    cfg.quantization = read_quant_config(tmp_path)
    target = load_model(cfg, tmp_path, "auto", CPU, torch.float32, MAX_POSITIONS)
    assert not isinstance(target.model.layers[3].self_attn.qkv_proj.method, UnquantizedLinearMethod)
    mtp = load_mtp(cfg, tmp_path, "auto", CPU, torch.float32, MAX_POSITIONS, 0, target)
    reference = _load(path)[2]
    for name, p in reference.state_dict().items():
        torch.testing.assert_close(mtp.state_dict()[name], p, rtol=0, atol=0, msg=name)
