"""`hotpath bench latency` times the engine a user gets: with no engine flag, the engine's every
setting is LLM()'s default (a bench engine sized to its batch once hid a crash of the default
one); an engine flag given overrides its setting."""

from dataclasses import replace

from hotpath.bench import latency
from hotpath.cli import build_parser
from hotpath.args import EngineArgs


def bench_namespace(*flags: str):
    ns = build_parser().parse_args(["bench", "latency", "--preset", "qwen3-8b", *flags])
    ns.load_format = "dummy"  # as latency.main sets it for a preset
    return ns


def test_bench_engine_is_the_default_engine():
    args = latency.engine_args(bench_namespace("--batch-size", "64", "--input-len", "2048"), "preset-dir")
    assert args == replace(EngineArgs(), model="preset-dir", load_format="dummy", skip_tokenizer_init=True)


def test_engine_flags_override():
    given = dict(max_model_len=4096, num_gpu_blocks_override=300, max_num_seqs=8,
                 enable_prefix_caching=False, max_num_batched_tokens=4096, gpu_memory_utilization=0.5,
                 enforce_eager=True, async_scheduling=False, dtype="float16")
    ns = bench_namespace()
    vars(ns).update(given)  # as the engine flags set them
    args = latency.engine_args(ns, "preset-dir")
    assert {name: getattr(args, name) for name in given} == given


def test_speculative_steps_count_every_token(tiny_model_factory):
    """With speculation a step emits several tokens a request: TPOT is the decode time over the
    tokens each request emitted (not over the steps), and the speculation counters of the timed
    run come with it."""
    import argparse

    from hotpath.engine.engine import Engine

    path, _ = tiny_model_factory("qwen2-gqa4-tied")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "adaptive": False}
    engine = Engine(EngineArgs(model=str(path), device="cpu", dtype="float32", skip_tokenizer_init=True,
                               max_model_len=256, speculative_config=spec))
    ns = argparse.Namespace(input_len=24, output_len=40, images=0)
    res = latency._time_batch(engine, ns, 2)
    steps = (ns.output_len - 1) / res["tokens_per_step"]
    assert res["tokens_per_step"] > 1 and res["spec_accepted_tokens"] > 0
    assert res["spec_verify_rows"] <= 2 * round(steps)  # each step verifies up to one row a request
    assert res["output_tokens_per_s"] == 2 / res["tpot_s"]
