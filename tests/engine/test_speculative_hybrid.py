"""Speculative decoding on hybrid (Gated DeltaNet) models: a verify row advances the layers' state
slot by all its tokens, and after acceptance the slot is rolled back to the state after the kept
ones (GatedDeltaNet.rollback, ModelRunner.rollback_states).

Through the engine: greedy output with speculation equals it without, token for token, for the
n-gram drafter, a draft model (the target perturbed: a hybrid draft, whose own drafts run on a copy
of its slot) and the target drafting for itself (every draft accepted), on Qwen3-Next and Qwen3.5
tiny models, together, with chunked prefill, with preemption, with prefix-cache hits, with async
scheduling and the adaptive choice of k, and in a
second turn whose prompts extend the first's outputs (hits on snapshots saved while decoding, with
a snapshot at every block: some saved in verify rows past the tokens they kept, which must never
be registered; skipping the saves of verify rows instead fails that test: the pending snapshot
would stay labelled with a boundary it does not hold).
The layer alone: a verify-like forward of k + 1 tokens rolled back to kept in 1..k+1 leaves the
slots as a forward of only the kept tokens does, on the reference ops and (TRITON_INTERPRET=1 on
a machine without a GPU) through the Triton conv, chunked rule and norm kernels."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import perturbed_copy

from hotpath import LLM, SamplingParams
from hotpath.layers.gated_delta import GatedDeltaNet
from hotpath.ops import backend
from hotpath.layers.forward_batch import ForwardBatch
from hotpath.runner.model_runner import ModelRunner

if not torch.cuda.is_available():  # before any kernel module is imported (see tests/ops/conftest.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

LENGTHS = [5, 33, 70, 48]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def make_setup(name, tiny_model_factory, tmp_path_factory):
    """(target dir, a draft: the target with its weights perturbed, prompts that repeat a stretch
    of themselves, so n-gram lookups find something). The target is the tiny model made to depend
    on its linear-attention state (`sharpened`), so a state off by a token changes its tokens."""
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(11)
    vocab = hf_model.config.vocab_size
    path = sharpened(path, tmp_path_factory.mktemp(f"sharp-{name}"), g)
    prompts = []
    for n in LENGTHS:
        p = torch.randint(3, vocab, (n,), generator=g).tolist()
        prompts.append(p + p[: n // 2])
    draft = perturbed_copy(Path(path), tmp_path_factory.mktemp(f"draft-{name}"), g, 0.3)
    return str(path), str(draft), prompts


# every case on Qwen3-Next's tiny model (Gated DeltaNet, gated attention, the shared-expert MoE);
# Qwen3.5's through one case (the CPU suite's time)
@pytest.fixture(scope="module")
def setup(tiny_model_factory, tmp_path_factory):
    return make_setup("qwen3next-hybrid", tiny_model_factory, tmp_path_factory)


def sharpened(path, out, g):
    """A copy of the tiny checkpoint at `path` whose tokens depend on its linear-attention state:
    the layers' out_proj scaled up 8x (at random init their output is a small part of the
    residual stream: a state that had fed a token twice, or not at all, rarely changed the argmax;
    now a draft model whose own drafts advanced its state gets most of them rejected), and a
    random LM head in place of tied embeddings (a tiny tied model repeats its last token forever:
    its last hidden state is mostly that token's embedding)."""
    for f in path.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    config = json.loads((path / "config.json").read_text())
    (f,) = path.glob("*.safetensors")
    tensors = {k: v * 8 if "linear_attn.out_proj" in k else v for k, v in load_file(f).items()}
    if config.get("tie_word_embeddings"):
        config["tie_word_embeddings"] = False
        embed = tensors["model.embed_tokens.weight"]
        tensors["lm_head.weight"] = embed.std() * torch.randn(embed.shape, generator=g)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, out / f.name, metadata={"format": "pt"})
    return out


def make_llm(path, **kwargs):
    return LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", **{"max_model_len": 512, **kwargs})


def generate(llm, prompts, params=PARAMS):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def plain(setup):
    path, _, prompts = setup
    return generate(make_llm(path), prompts)


def drafters(draft):
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                  "adaptive": False},
        "draft_model": {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "adaptive": False},
    }


# prefix hits: test_qwen3_5_greedy_equals_plain and test_second_turn_hits_snapshots_saved_while_verifying
@pytest.mark.parametrize("method, case", [("draft_model", "preempted"), ("ngram", "chunked")])
def test_greedy_equals_plain(setup, plain, method, case):
    check_greedy_equals_plain(setup, plain, method, case)


def test_qwen3_5_greedy_equals_plain(tiny_model_factory, tmp_path_factory):
    setup = make_setup("qwen3_5-dense", tiny_model_factory, tmp_path_factory)
    check_greedy_equals_plain(setup, generate(make_llm(setup[0]), setup[2]), "draft_model", "prefix_hits")


def check_greedy_equals_plain(setup, plain, method, case):
    path, draft, prompts = setup
    kwargs = {"speculative_config": drafters(draft)[method]}
    if case == "chunked":
        kwargs["max_num_batched_tokens"] = 20
    if case == "preempted":  # too few blocks for all four at once: the newest are preempted
        kwargs.update(num_gpu_blocks_override=18, max_model_len=256, enable_prefix_caching=False)
    llm = make_llm(path, **kwargs)
    rolled_back = count_rollbacks(llm)
    got = generate(llm, prompts)  # all together, the first time
    if case == "prefix_hits":  # then again, from the prompts' cached blocks and snapshots
        assert got == plain
        hits = llm.engine.kv_cache.prefix_hit_tokens
        got = generate(llm, prompts)
        assert llm.engine.kv_cache.prefix_hit_tokens > hits
    if case == "preempted":
        assert llm.engine.scheduler.num_preemptions > 0
    assert got == plain
    stats = llm.engine.spec_stats
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    if method == "draft_model":  # the perturbed draft is rejected at times: states were rolled back
        assert stats.num_accepted_tokens < stats.num_draft_tokens and rolled_back["rows"] > 0


@pytest.mark.parametrize("method", ["draft_model"])
def test_async_scheduling_adaptive(setup, plain, method):
    """With async scheduling (the GPU default) and the adaptive choice of k: decode steps without
    drafts stay in flight (their input tokens pending on the device), verify steps drain them first
    and are rolled back before the next launch."""
    path, draft, prompts = setup
    llm = make_llm(path, async_scheduling=True, speculative_config={**drafters(draft)[method], "adaptive": True})
    assert generate(llm, prompts) == plain
    assert llm.engine.spec_stats.num_draft_tokens > 0


def count_rollbacks(llm):
    """Counts the verify rows rolled back (kept fewer than their tokens), and those whose pending
    snapshot was saved in the step past the tokens they kept (it must never be registered)."""
    runner, counts = llm.engine.executor.runner, {"rows": 0, "snapshots_past_kept": 0}
    rollback = runner.rollback_states

    def counting(rows):
        engine_seqs = {s.seq_id: s for s in llm.engine.scheduler.running}  # the snapshots' owner
        for seq, kept in rows:
            counts["rows"] += kept < runner._verify_rows[seq.seq_id][1]
            owner = engine_seqs.get(seq.seq_id)
            past = (owner is not None and owner.snapshot is not None
                    and owner.snapshot_boundary > seq.num_computed_tokens)
            counts["snapshots_past_kept"] += past
        rollback(rows)

    runner.rollback_states = counting
    return counts


@pytest.mark.parametrize("method", ["draft_model"])
def test_second_turn_hits_snapshots_saved_while_verifying(setup, method):
    """Turn two's prompts are turn one's prompts and outputs and a few tokens more; with a
    snapshot registered at every block boundary, its hits resume from states saved while turn one
    decoded with speculation, in verify rows. Its output equals plain decoding's."""
    path, draft, prompts = setup
    llm = make_llm(path, speculative_config=drafters(draft)[method], state_snapshot_stride=16)
    counts = count_rollbacks(llm)
    first = generate(llm, prompts)
    second_prompts = [p + out + [7, 8, 9] for p, out in zip(prompts, first)]
    hits = llm.engine.kv_cache.prefix_hit_tokens
    got = generate(llm, second_prompts)
    # further than the prompts' own blocks reach: hits on snapshots saved while decoding
    assert llm.engine.kv_cache.prefix_hit_tokens - hits > sum(len(p) // 16 * 16 for p in prompts)
    if method == "draft_model":
        assert counts["snapshots_past_kept"] > 0
    assert got == generate(make_llm(path, enable_prefix_caching=False), second_prompts)


@pytest.mark.parametrize("k", [9])  # verify rows past the decode kernel's 8 queries
def test_self_draft_accepts_everything(setup, plain, k):
    """The target drafting for itself (a hybrid draft model): every draft is its own greedy token,
    which needs its drafts not to advance the state it catches up from (drafting on its own slot,
    most of them were rejected)."""
    path, _, prompts = setup
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": k, "adaptive": False}
    llm = make_llm(path, speculative_config=spec)
    assert generate(llm, prompts) == plain
    stats = llm.engine.spec_stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0


def test_dense_target_with_hybrid_draft(tiny_model_factory):
    """A hybrid draft for a dense target (the same vocabulary): the draft's state slots work
    without the target having any (and the target's prefix caching needs no snapshots)."""
    target, hf_model = tiny_model_factory("qwen2-gqa4-tied")
    draft, _ = tiny_model_factory("qwen3_5-dense")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in (9, 40)]
    want = generate(make_llm(str(target)), prompts)
    llm = make_llm(str(target), speculative_config={"method": "draft_model", "model": str(draft),
                                                    "num_speculative_tokens": 3, "adaptive": False})
    runner = llm.engine.executor.runner
    assert not runner.state_layers and runner.draft_state_layers and llm.engine.kv_cache.snapshots is None
    assert generate(llm, prompts) == want
    assert llm.engine.spec_stats.num_draft_tokens > 0


# ---- the layer alone -----------------------------------------------------------------------

@pytest.fixture(params=["reference", "triton"])
def ops_backend(request):
    if request.param == "triton":
        if not backend.triton_available():
            pytest.skip("triton is not installed")
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the interpreter case is for CPU-only machines")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("TRITON_INTERPRET is not 1")
    previous = backend.get_backend()
    backend.set_backend(request.param)
    yield request.param
    backend.set_backend(previous)


def _layer(num_slots: int, seed: int) -> GatedDeltaNet:
    g = torch.Generator().manual_seed(seed)
    layer = GatedDeltaNet(hidden_size=32, num_k_heads=2, num_v_heads=4, k_head_dim=16, v_head_dim=8,
                          conv_width=4, eps=1e-6, layout="qwen3_5")
    with torch.no_grad():
        layer.conv1d.weight.copy_(torch.randn(layer.conv1d.weight.shape, generator=g) * 0.5)
        layer.dt_bias.copy_(torch.randn(4, generator=g))
        layer.A_log.copy_(torch.rand(4, generator=g) * 2 - 4)
    spec = layer.cache_spec()
    layer.bind_cache(spec.allocate(num_slots, torch.float32, torch.device("cpu")),
                     spec.allocate(0, torch.float32, torch.device("cpu")))
    conv, state = layer.state
    conv.copy_(torch.randn(conv.shape, generator=g))
    state.copy_(torch.randn(state.shape, generator=g) * 0.5)
    return layer


def _batch(rows: list[tuple[int, int, int]], verify: list[int] | None = None) -> ForwardBatch:
    """rows: (slot, first position, tokens); only what the layer reads."""
    cu = [0]
    for _, _, n in rows:
        cu.append(cu[-1] + n)
    i32 = torch.int32
    verify_tokens = None
    if verify:
        verify_tokens = torch.tensor([t for i in verify for t in range(cu[i], cu[i + 1])], dtype=torch.int64)
    return ForwardBatch(
        cu_query_lens=torch.tensor(cu, dtype=i32),
        context_lens=torch.tensor([first + n for _, first, n in rows], dtype=i32),
        block_tables=torch.zeros(len(rows), 1, dtype=i32), slot_mapping=torch.zeros(cu[-1], dtype=torch.int64),
        logits_indices=torch.zeros(0, dtype=torch.int64), max_query_len=max(n for *_, n in rows),
        max_context_len=max(first + n for _, first, n in rows),
        state_slots=torch.tensor([slot for slot, _, _ in rows], dtype=torch.int64), cu_query_lens_host=cu,
        verify_rows=verify, verify_tokens=verify_tokens,
    )


@pytest.mark.parametrize("k", [3, 8])
def test_layer_rollback_equals_running_only_the_kept_tokens(ops_backend, k, monkeypatch):
    """Rows 0, 2, 3 verify k + 1 tokens from their slots' states; row 1 is a prompt chunk beside
    them, row 4 a prompt from position 0. After rolling the verify rows back to kept tokens (under
    conv_width - 1 of them: the window reaches back into the saved one), every slot equals a
    forward of only the kept tokens from the same start (the conv windows exactly); the other
    slots are as the step left them. Under the interpreter the conv, the chunk table, the norm and
    (forced in fp32, which the op would give the reference) the chunked rule run as Triton kernels,
    in the step and in the rollback."""
    if ops_backend == "triton":
        from hotpath.layers import gated_delta
        from hotpath.ops.gated_delta import triton_chunked

        def rule(q, k, v, g, beta, cu, states, slots, chunks=None):
            return triton_chunked.gated_delta_rule(q, k, v, g, beta, cu, states, slots, chunks=chunks)

        monkeypatch.setattr(gated_delta, "gated_delta_rule", rule)
    n = k + 1
    rows = [(5, 20, n), (1, 9, 6), (0, 1, n), (3, 40, n), (6, 0, 7)]
    verify = [0, 2, 3]
    layer = _layer(num_slots=8, seed=k)
    conv0, state0 = (x.clone() for x in layer.state)
    g = torch.Generator().manual_seed(100 + k)
    T = sum(r[2] for r in rows)
    mixed = torch.randn(T, layer.conv_dim, generator=g)
    z = torch.randn(T, layer.num_v_heads, layer.v_head_dim, generator=g)
    b, a = torch.randn(T, layer.num_v_heads, generator=g), torch.randn(T, layer.num_v_heads, generator=g)
    cu = _batch(rows).cu_query_lens_host
    with torch.inference_mode():
        layer._mix(mixed, z, b, a, _batch(rows, verify))
    assert layer.verify is not None and layer.verify.slots == [5, 0, 3]
    after_step = [x.clone() for x in layer.state]
    for kept in ([1, 1, 1], [2, n, 1], [n - 1, 3, n], [n, n, n]):
        for pool, value in zip(layer.state, after_step):
            pool.copy_(value)
        with torch.inference_mode():
            layer.rollback(list(range(3)), kept)
        got_conv, got_state = (x.clone() for x in layer.state)
        # the same start, only the kept tokens of the verify rows (and all of the others')
        ref = _layer(num_slots=8, seed=k)
        for pool, value in zip(ref.state, (conv0, state0)):
            pool.copy_(value)
        keep = dict(zip(verify, kept))
        sub = [(slot, first, keep.get(i, m)) for i, (slot, first, m) in enumerate(rows)]
        index = torch.tensor([t for i, (_, _, m) in enumerate(sub) for t in range(cu[i], cu[i] + m)])
        with torch.inference_mode():
            ref._mix(mixed[index], z[index], b[index], a[index], _batch(sub))
        want_conv, want_state = ref.state
        torch.testing.assert_close(got_conv, want_conv, rtol=0, atol=0)
        torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)
        others = [1, 6, 2, 4, 7]  # the other rows' slots, and slots no row uses: as the step left them
        assert torch.equal(got_conv[others], after_step[0][others])
        assert torch.equal(got_state[others], after_step[1][others])


def test_rollback_states_skips_rows_that_kept_everything(tiny_model_factory, monkeypatch):
    """The runner rolls back only rows that kept fewer than their tokens, by their index among the
    step's verify rows, and frees the records afterwards."""
    path, _ = tiny_model_factory("qwen3next-hybrid")
    llm = make_llm(str(path), speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                  "adaptive": False})
    runner = llm.engine.executor.runner
    calls = []
    monkeypatch.setattr(GatedDeltaNet, "rollback", lambda self, rows, kept: calls.append((rows, kept)))

    class Seq:
        def __init__(self, seq_id):
            self.seq_id = seq_id

    runner._verify_rows = {10: (0, 4), 11: (1, 4), 12: (2, 2)}
    ModelRunner.rollback_states(runner, [(Seq(10), 4), (Seq(11), 2), (Seq(12), 1)])
    assert calls == [([1, 2], [2, 1])] * len(runner.state_layers)
    assert runner._verify_rows == {} and all(layer.verify is None for layer in runner.state_layers)
