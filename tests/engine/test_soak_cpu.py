"""The soak workload (tests/soak.py) at a small scale on the CPU, reference ops: a cache small
enough to preempt, a token budget small enough to chunk prefills, aborts, stops, n > 1 and prefix
hits. Every request ends exactly once and no KV block is left held, with async scheduling and
without; the two runs give the same tokens (up to near ties). tests/gpu/test_soak.py runs the
workload large on a GPU, Triton against the reference ops."""

from hotpath import LLM
from soak import TOP_LOGPROBS, compare, make_soak_model, make_workload, report, run_soak

NUM_REQUESTS = 40
MAX_PROMPT_LEN = 512
MAX_OUTPUT_LEN = 48
MAX_POSITIONS = 576
# 640 tokens: the longest request fits (the engine asks that max_model_len does), and a burst
# of a few long prompts does not
NUM_BLOCKS = 40


def test_soak_cpu(tmp_path):
    model_dir, vocab_size = make_soak_model(tmp_path, MAX_POSITIONS)
    requests = make_workload(NUM_REQUESTS, vocab_size, MAX_PROMPT_LEN, MAX_OUTPUT_LEN, seed=1)
    runs = {}
    # the synchronous run is the reference: its greedy requests return top logprobs for compare()
    for async_scheduling, top_logprobs in ((True, None), (False, TOP_LOGPROBS)):
        llm = LLM(str(model_dir), device="cpu", num_gpu_blocks_override=NUM_BLOCKS,
                  max_num_batched_tokens=256, async_scheduling=async_scheduling)
        runs[async_scheduling] = run_soak(llm, requests, top_logprobs)
    diff = compare(runs[True], runs[False], requests)
    report({"device": "cpu", "ops": "reference", "async": runs[True].counts, "sync": runs[False].counts, **diff})
    for counts in (runs[True].counts, runs[False].counts):
        # the workload reached what it is there to reach (which stop fires is up to the random model)
        assert counts["preemptions"] > 0 and counts["aborts"] > 0 and counts["prefix_cache_hit_tokens"] > 0
        assert counts["stops_by_string"] + counts["stops_by_token"] > 0
    assert diff["compared_sequences"] > 0 and diff["sampled_divergences"] == 0, diff
