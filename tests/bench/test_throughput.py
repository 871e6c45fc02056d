"""`hotpath bench throughput`: its workload, its step counting and its flags (the timed run itself
needs a GPU)."""

import pytest

from hotpath import LLM
from hotpath.bench import throughput
from hotpath.cli import build_parser


def test_random_workload_lengths_in_range():
    work = throughput.random_workload(200, (3, 9), (1, 4), vocab=50, seed=1)
    assert len(work) == 200
    assert {len(p) for p, _ in work} == set(range(3, 10))
    assert {m for _, m in work} == {1, 2, 3, 4}
    assert all(0 <= t < 50 for p, _ in work for t in p)
    assert work == throughput.random_workload(200, (3, 9), (1, 4), vocab=50, seed=1)


def test_flags_default_to_the_users_engine():
    ns = build_parser(["bench", "throughput"]).parse_args(
        ["bench", "throughput", "--preset", "qwen3-8b", "--input-len-range", "10,20"])
    assert ns.input_len_range == (10, 20) and ns.output_len_range == (128, 512)
    assert ns.max_model_len is None and ns.max_num_seqs == 256 and ns.enable_prefix_caching
    with pytest.raises(SystemExit):
        build_parser(["bench", "throughput"]).parse_args(["bench", "throughput", "--input-len-range", "9,3"])


def test_run_counts_every_token_and_step_kind(tiny_model_factory):
    path, hf_model = tiny_model_factory("qwen3-gqa8-untied-hd")
    llm = LLM(str(path), skip_tokenizer_init=True, device="cpu", max_model_len=256,
              max_num_seqs=4, max_num_batched_tokens=32)
    kinds = throughput.StepKinds(llm)
    work = throughput.random_workload(10, (5, 40), (2, 9), hf_model.config.vocab_size, seed=2)
    res = throughput.run(llm, work)
    assert res["output_tokens"] == sum(m for _, m in work)
    assert res["prompt_tokens"] == sum(len(p) for p, _ in work)
    # admissions as sequences finish: prefill chunks beside decodes, and decodes alone
    assert kinds.counts["mixed"] > 0 and kinds.counts["decode_eager"] > 0
