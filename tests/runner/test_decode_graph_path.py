"""The decode-graph path of the runner (static buffers, sampling captured after the LM head),
run on the CPU: a stand-in replays the captured forward eagerly, so everything but the CUDA graph
itself is the code a GPU runs."""

import pytest
import torch

from hotpath import LLM, SamplingParams
from hotpath.runner import graphs as runner_graphs, row_graphs
from hotpath.runner.decode_inputs import OUT_SLOTS

from eager_graphs import capture_eager_graphs  # tests/, on sys.path through conftest.py
from output_diff import first_difference

MODEL = "qwen3-gqa8-untied-hd"


def make_llm(path, graphs: bool, **kwargs) -> LLM:
    kwargs = {"max_num_seqs": 8, **kwargs}
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256, **kwargs)
    if graphs:
        capture_eager_graphs(llm)
    return llm


@pytest.fixture(scope="module")
def prompts(tiny_model_factory):
    path, hf_model = tiny_model_factory(MODEL)
    g = torch.Generator().manual_seed(5)
    return path, [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist()
                  for n in (3, 17, 40)]


def generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [[(c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason) for c in o.outputs]
            for o in outs]


def assert_same(got, want) -> None:
    """Token ids, ranks and finish reasons exactly; logprobs up to rounding: the graph path's
    padded batches may sum in another order than the eager path's (see output_diff)."""
    diff = first_difference(got, want)
    assert diff is None, diff


PLAIN = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
SAMPLED = [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=3, logprobs=0),
]


def test_plain_greedy_decode_skips_the_sampler(prompts, monkeypatch):
    path, ps = prompts
    want = generate(make_llm(path, graphs=False), ps, PLAIN)
    llm = make_llm(path, graphs=True)
    calls = []
    sampler = llm.engine.executor.runner.sampler
    monkeypatch.setattr(llm.engine.executor.runner, "sampler", lambda *a: calls.append(len(a[0])) or sampler(*a))
    assert_same(generate(llm, ps, PLAIN), want)
    # only the prefill steps sampled eagerly (a graph replays decodes of up to 8 rows)
    assert calls and sum(calls) == len(ps)


def test_short_context_graphs(prompts, monkeypatch):
    """A step replays the graph for the shortest context limit that holds its longest context
    (graphs for short contexts besides the one for max_model_len), and the tokens stay those of
    the eager path."""
    path, ps = prompts
    batches = [ps[:2], ps]  # longest contexts up to 29, then up to 51 tokens
    eager = make_llm(path, graphs=False)  # the same two calls, the second with prefix-cache hits
    want = [generate(eager, b, PLAIN) for b in batches]
    monkeypatch.setattr(runner_graphs, "SHORT_CONTEXT_GRAPHS", (32, 48))
    # as if the attention split contexts into 16-token pieces: 2 and 3 splits against 16
    monkeypatch.setattr(row_graphs, "decode_splits", lambda seqs, heads, ctx, device: -(-ctx // 16))
    llm = make_llm(path, graphs=True)
    runner = llm.engine.executor.runner
    limits = [32, 48, 256]
    replays = []  # (the graph's context limit, the step's longest context)

    def recorded(graph, bs, limit):
        replay = graph.replay

        def run():
            longest = int(runner.decode_inputs.views(bs, limit)[2].context_lens.max())
            replays.append((limit, longest))
            replay()
        graph.replay = run

    for bs, (graph, _) in runner.graphs.items():
        assert [ctx for ctx, _, _ in runner.short_graphs[bs]] == limits[:2]
        recorded(graph, bs, 256)
        for ctx, short, _ in runner.short_graphs[bs]:
            recorded(short, bs, ctx)
    assert_same([generate(llm, b, PLAIN) for b in batches], want)
    for limit, longest in replays:
        assert longest <= limit and not any(longest <= s for s in limits if s < limit)
    assert {limit for limit, _ in replays} == set(limits)


@pytest.mark.parametrize("params", SAMPLED)
def test_other_rows_sample_the_graph_logits(prompts, params):
    path, ps = prompts
    mixed = [params, PLAIN, params]
    want = generate(make_llm(path, graphs=False), ps, mixed)
    assert_same(generate(make_llm(path, graphs=True), ps, mixed), want)


def test_async_scheduling_through_the_graphs(prompts, monkeypatch):
    """Pipelined graph steps: inputs taken from the previous graph's sampled ids in place, or
    gathered when rows move (a sequence stopped or reached max_tokens), or from an eager step's
    sampled ids (a batch past the largest graph)."""
    path, ps = prompts
    long_run = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    free = generate(make_llm(path, graphs=False), ps[1:2], long_run)[0][0][0]
    stop = next(t for i, t in enumerate(free) if i >= 4 and t not in free[:i])  # stops at i + 1
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, stop_token_ids=[stop])
              for n in (14, 20, 9)] * 2
    want = generate(make_llm(path, graphs=False), ps * 2, params)
    llm = make_llm(path, graphs=True, async_scheduling=True, max_num_seqs=6)
    del llm.engine.executor.runner.graphs[6]  # 5 or 6 rows run eagerly, fewer through graphs
    inputs = llm.engine.executor.runner.decode_inputs
    kinds = []
    fill = inputs.fill

    slots = []

    def fill_and_record(seqs, size, prev=None, slot=None):
        if prev is not None:
            ids, rows = prev
            in_place = rows == list(range(len(seqs)))
            graph = ids.data_ptr() == inputs.token_ids.data_ptr()
            kinds.append("eager" if not graph else "in place" if in_place else "gathered")
        slots.append(slot)
        fill(seqs, size, prev, slot)

    monkeypatch.setattr(inputs, "fill", fill_and_record)
    assert_same(generate(llm, ps * 2, params), want)
    assert set(kinds) == {"eager", "in place", "gathered"}
    # tokens came back through the host ring, two steps in flight at a time; every row is given
    # back but that of the step still in flight (the run's last, of finished sequences only)
    assert set(slots) == {OUT_SLOTS - 1, OUT_SLOTS - 2}
    held = llm.engine.executor.worker.steps[llm.engine._in_flight.step_id].out_slot
    assert sorted(inputs._free_slots + [held]) == list(range(OUT_SLOTS))


def test_async_scheduling_with_decodes_the_budget_left_out(prompts):
    path, _ = prompts
    requests = [[5 + i] for i in range(3)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (3, 10, 10)]
    want = generate(make_llm(path, graphs=False), requests, params)
    llm = make_llm(path, graphs=True, async_scheduling=True, max_num_batched_tokens=2)
    assert_same(generate(llm, requests, params), want)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("name", ["qwen3next-hybrid", "qwen3_5-dense"])
def test_hybrid_decode_through_the_graphs(name, async_scheduling, tiny_model_factory, monkeypatch):
    """A hybrid model's decode steps replay the graphs (each row's state slot among the static
    inputs, padding rows on the scratch slot) and give the eager path's tokens and logprobs. Steps
    that save a state snapshot (a block boundary) or restore one (a prefix hit whose first step is
    a single token) replay the graph too: the runner restores before the replay and saves after
    it. The same prompts again restore snapshots; the 17-token one alone is such a first step; a
    second turn (a prompt and its output and more) restores one a decode graph step saved."""
    path, hf_model = tiny_model_factory(name)
    g = torch.Generator().manual_seed(6)
    ps = [torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in (3, 17, 40)]
    # decodes cross block boundaries (16 tokens); the 17-token prompt's hit leaves one token
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, logprobs=0) for m in (24, 18, 24)]
    rounds = [(ps, params), (ps, params), (ps[1:2], params[1])]
    eager = make_llm(path, graphs=False, async_scheduling=async_scheduling)
    want = [generate(eager, *r) for r in rounds]
    # its hit reaches the first turn's last boundary, 48 tokens: a decode step's save
    turn2 = [ps[2] + want[0][2][0][0] + list(range(3, 13))]
    rounds.append((turn2, params[0]))
    want.append(generate(eager, *rounds[-1]))
    llm = make_llm(path, graphs=True, async_scheduling=async_scheduling)
    runner = llm.engine.executor.runner
    steps = []  # [decode-shaped, saves a snapshot, restores one, replayed a graph] per launch
    launch, run_graph = runner.launch, runner._run_decode_graph

    def launch_spy(scheduled, prev=None, mask_follows=False):
        steps.append([all(n == 1 and s.num_computed_tokens + 1 == s.num_tokens for s, n in scheduled),
                      any(s.save_at is not None for s, _ in scheduled),
                      any(s.restore_snapshot is not None for s, _ in scheduled), False])
        return launch(scheduled, prev, mask_follows)

    def graph_spy(*args):
        steps[-1][3] = True
        return run_graph(*args)

    monkeypatch.setattr(runner, "launch", launch_spy)
    monkeypatch.setattr(runner, "_run_decode_graph", graph_spy)
    assert_same([generate(llm, *r) for r in rounds], want)
    decodes = [(save, restore, graph) for decode, save, restore, graph in steps if decode]
    assert any(save for save, _, _ in decodes) and any(restore for _, restore, _ in decodes)
    assert all(graph for _, _, graph in decodes), decodes
    assert llm.engine.kv_cache.prefix_hit_tokens > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_greedy_matches_the_sampler(prompts, dtype):
    """The Triton argmax + logprob captured in the graph against the eager Sampler on the same
    graph logits (logprobs=1 sends a row through the Sampler)."""
    path, ps = prompts
    # a fixed cache: sized from free memory, each LLM of the test process (and of parallel test
    # workers) would take 90% of what the others left, and the second found none
    llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype=dtype, max_model_len=256,
              max_num_seqs=8, num_gpu_blocks_override=64)
    assert llm.engine.executor.runner.graphs
    top1 = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    for plain, sampled in zip(generate(llm, ps, PLAIN), generate(llm, ps, top1)):
        ids, _, lps, _ = plain[0]
        want_ids, _, want_lps, _ = sampled[0]
        assert ids == want_ids
        for t, got, want in zip(ids, lps, want_lps):
            assert abs(got[t].logprob - want[t].logprob) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_short_context_graphs_match_eager(tiny_model_factory, monkeypatch):
    """Real graphs for short contexts (one split, two) beside the one for max_model_len (four),
    stepping contexts across both limits, against the eager path."""
    path, hf_model = tiny_model_factory(MODEL)
    g = torch.Generator().manual_seed(4)
    batches = [[torch.randint(3, hf_model.config.vocab_size, (n,), generator=g).tolist() for n in lens]
               for lens in ((30,), (60, 20), (100,), (150, 40, 90))]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=0)
    monkeypatch.setattr(runner_graphs, "SHORT_CONTEXT_GRAPHS", (64, 128))

    def run(eager):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype="float32", max_model_len=256,
                  max_num_seqs=4, num_gpu_blocks_override=64, enforce_eager=eager, enable_prefix_caching=False)
        if not eager:
            assert [ctx for ctx, _, _ in llm.engine.executor.runner.short_graphs[1]] == [64, 128]
        return [generate(llm, b, params) for b in batches]

    for got, want in zip(run(False), run(True)):
        for (ids, _, lps, _), (want_ids, _, want_lps, _) in zip([o[0] for o in got], [o[0] for o in want]):
            assert ids == want_ids
            for t, a, b in zip(ids, lps, want_lps):
                assert abs(a[t].logprob - b[t].logprob) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_async_scheduling_matches_sync(tiny_model_factory):
    """Real CUDA graphs and a real device running ahead of the host: 24 sequences of mixed
    lengths stop on their own tokens (blocks freed while the next step is in flight and handed to
    the sequences that follow) or at max_tokens; async scheduling must change nothing."""
    path, hf_model = tiny_model_factory(MODEL)
    g = torch.Generator().manual_seed(9)
    ps = [torch.randint(3, hf_model.config.vocab_size, (int(n),), generator=g).tolist()
          for n in torch.randint(1, 120, (24,), generator=g)]

    def run(async_scheduling, params):
        llm = LLM(str(path), skip_tokenizer_init=True, device="cuda", dtype="float32",
                  max_model_len=256, max_num_seqs=8, num_gpu_blocks_override=64,
                  async_scheduling=async_scheduling)
        assert llm.engine.async_scheduling == async_scheduling
        return generate(llm, ps, params)

    free = run(False, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=int(m), ignore_eos=True, logprobs=0,
                             stop_token_ids=[out[0][0][int(m) // 2]] if i % 2 else [])
              for i, (out, m) in enumerate(zip(free, torch.randint(1, 30, (24,), generator=g)))]
    want, got = run(False, params), run(True, params)
    for (ids, _, lps, reason), (want_ids, _, want_lps, want_reason) in zip(
            [o[0] for o in got], [o[0] for o in want]):
        assert (ids, reason) == (want_ids, want_reason)
        for t, a, b in zip(ids, lps, want_lps):
            assert abs(a[t].logprob - b[t].logprob) < 1e-4
