"""Speculative steps in graphs (runner/row_graphs.py), run on the CPU: a stand-in replays each
captured forward eagerly, so everything but the CUDA graph itself is the code a GPU runs. Verify
steps (rows of 1 + K tokens, rows with fewer drafts padded), the draft model's catch-up over
windows of 1 + K tokens and its one-token steps fed from the last step's argmax on the device:
greedy output equals the plain engine's, token for token, with the graphs checked to have run,
and the drafts are the eager drafter's."""

import pytest
from eager_graphs import capture_eager_graphs
from test_speculative import drafters, make_setup

from hotpath import LLM, SamplingParams

# rows near their max_tokens have fewer draft slots than the others: they ride along, padded
PARAMS = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (32, 19, 32, 23, 32, 17)]


@pytest.fixture(scope="module")
def setup(tiny_model_factory, tmp_path_factory):
    return make_setup("qwen2-gqa4-tied", tiny_model_factory, tmp_path_factory)


def generate(path, prompts, params, graphs: bool, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              max_num_seqs=8, **kwargs)
    runner = llm.engine.executor.runner
    if graphs:
        capture_eager_graphs(llm)
    replays = []  # (draft model?, q, rows' token counts) of each replay

    def recorded(run, key):
        def replay(seqs, rows, prev=None):
            replays.append((*key, [len(t) for _, t in rows]))
            return run(seqs, rows, prev)
        return replay

    for key, g in runner.row_graphs.items():
        g.run = recorded(g.run, key)
    prepare = runner._prepare

    def eager(scheduled, prev=None):  # a step outside the graphs: never a verify step here
        replays.append(("eager", any(seq.draft_token_ids for seq, _ in scheduled)))
        return prepare(scheduled, prev)

    runner._prepare = eager
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], replays, llm


@pytest.fixture(scope="module")
def plain(setup):
    path, _, prompts = setup
    return generate(path, prompts, PARAMS, graphs=False)[0]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_graph_steps_equal_plain(setup, plain, method):
    path, draft, prompts = setup
    want = plain
    spec = drafters(draft)[method]
    got, replays, llm = generate(path, prompts, PARAMS, graphs=True, speculative_config=spec)
    assert got == want
    k = spec["num_speculative_tokens"]
    assert ("eager", True) not in replays  # every verify step in a graph, near max_tokens too
    verify = [r for r in replays if r[0] is False]
    assert verify and all(q == k + 1 and max(lens) <= q for _, q, lens in verify)
    assert any(min(lens) < q for _, q, lens in verify), verify  # rows with fewer drafts, padded
    if method == "draft_model":
        assert any(r[:2] == (True, k + 1) for r in replays)  # catch-up in a graph
        assert sum(r[:2] == (True, 1) for r in replays) >= k - 1  # one-token draft steps
        # the same drafts as the eager drafter's (its inputs are the last step's argmax on the
        # device): the same acceptance at every position
        _, _, eager = generate(path, prompts, PARAMS, graphs=False, speculative_config=spec)
        assert llm.engine.spec_stats.accepted_per_pos == eager.engine.spec_stats.accepted_per_pos
    assert set(llm.engine.executor.runner.row_graphs) == ({(False, k + 1), (True, k + 1), (True, 1)}
                                                 if method == "draft_model" else {(False, k + 1)})
    assert llm.engine.spec_stats.num_accepted_tokens > 0


def test_draft_model_catches_up_in_graphs_after_plain_steps(setup, plain):
    """After steps without drafts (the adaptive policy's k = 0) the draft model is a few tokens
    behind: it catches up in graphs over windows of 1 + K tokens, eagerly only after the prompts."""
    path, draft, prompts = setup
    want = plain
    spec = drafters(draft)["draft_model"]
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", dtype="float32", max_model_len=512,
              max_num_seqs=8, speculative_config=spec)
    engine = llm.engine
    capture_eager_graphs(llm)
    turn = iter(range(10**6))
    engine.speculation.policy.choose = lambda seqs, prefilling=False, behind=0: spec["num_speculative_tokens"] if next(turn) % 4 == 3 else 0
    eager, behind = [], []
    catch_up, in_graphs = engine.executor.worker.drafter._catch_up, engine.executor.worker.drafter._in_graphs
    engine.executor.worker.drafter._catch_up = lambda seqs, probs: eager.append(len(seqs)) or catch_up(seqs, probs)
    engine.executor.worker.drafter._in_graphs = lambda seqs, slots: behind.append(max(engine.executor.worker.drafter.behind([s]) for s in seqs)) or in_graphs(seqs, slots)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert eager == [len(prompts)]  # the prompts, once
    assert max(behind[1:]) > 1 + spec["num_speculative_tokens"]  # windows, not one


def test_rows_outside_plain_greedy_verify_on_the_graphs_logits(setup):
    """Greedy rows that ask for top logprobs or a penalty are not plain: the rejection sampler
    verifies them on the graph's logits, and their outputs still equal the plain engine's."""
    path, draft, prompts = setup
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.2)]
    for p in params:
        want, _, _ = generate(path, prompts[:3], p, graphs=False)
        got, replays, _ = generate(path, prompts[:3], p, graphs=True, speculative_config=drafters(draft)["ngram"])
        assert got == want
        assert any(r[0] is False for r in replays)
