"""`hotpath bench latency` times the engine a user gets: with no engine flag, the engine's every
setting is LLM()'s default (a bench engine sized to its batch once hid a crash of the default
one); an engine flag given overrides its setting."""

from dataclasses import replace

from hotpath.bench import latency
from hotpath.cli import build_parser
from hotpath.engine.args import EngineArgs


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
