"""The scheduler and the KV cache manager on their own: no model, steps simulated."""

import pytest

from hotpath.config import EngineConfig
from hotpath.engine import kv_cache as kv_module
from hotpath.engine.kv_cache import KVCacheManager
from hotpath.engine.scheduler import Scheduler
from hotpath.engine.sequence import Sequence
from hotpath.sampling_params import SamplingParams

BS = 4  # block size


def seq(seq_id: int, prompt: list[int], max_tokens: int = 100) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=str(seq_id), index=0, prompt_token_ids=list(prompt),
                    params=SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                    stop_token_ids=set())


def make(num_blocks: int, budget: int, caching: bool = False, max_num_seqs: int = 16):
    kv = KVCacheManager(num_blocks, BS, caching)
    cfg = EngineConfig(max_model_len=4096, block_size=BS, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs, enable_prefix_caching=caching)
    return kv, Scheduler(cfg, kv)


def run_step(sched: Scheduler, kv: KVCacheManager) -> dict[int, int]:
    """Schedules one step and applies it as the engine would (a sampled token is 7)."""
    out = sched.schedule()
    for s, n in out.scheduled:
        s.num_computed_tokens += n
        kv.cache_full_blocks(s)
        if s.num_computed_tokens == s.num_tokens:
            s.output_token_ids.append(7)
            if len(s.output_token_ids) >= s.max_tokens:
                sched.finish(s)
    # the invariant that keeps decodes from starving: only the last running sequence is mid-prefill
    assert all(s.num_tokens - s.num_computed_tokens <= 1 for s in sched.running[:-1])
    return {s.seq_id: n for s, n in out.scheduled}


def test_long_prompt_does_not_starve_decodes():
    kv, sched = make(num_blocks=1000, budget=64)
    decoders = [seq(i, [1, 2, 3]) for i in range(3)]
    for s in decoders:
        sched.add(s)
    run_step(sched, kv)  # their prefills
    long = seq(99, list(range(1000)))
    sched.add(long)
    for _ in range(10):
        step = run_step(sched, kv)
        assert all(step[s.seq_id] == 1 for s in decoders)  # every decode advances every step
        assert step[99] == 64 - 3  # the prompt takes what is left of the budget, in chunks
    assert long.num_computed_tokens == 610


def test_preemption_recomputes_and_loses_nothing():
    # 6 blocks of 4 tokens: two sequences of 8 prompt tokens + 8 outputs cannot both fit
    kv, sched = make(num_blocks=6, budget=64)
    a, b = seq(1, list(range(8)), max_tokens=8), seq(2, list(range(10, 18)), max_tokens=8)
    sched.add(a)
    sched.add(b)
    finished_order = []
    for _ in range(100):
        if not sched.has_unfinished():
            break
        run_step(sched, kv)
        finished_order += [s.seq_id for s in (a, b) if s.is_finished and s.seq_id not in finished_order]
    assert sched.num_preemptions > 0
    assert a.output_token_ids == [7] * 8 and b.output_token_ids == [7] * 8
    assert finished_order[0] == 1  # the earlier request keeps its blocks; the later one waits
    assert kv.num_free_blocks == 6


def test_prefix_hit_needs_the_same_tokens(monkeypatch):
    kv, sched = make(num_blocks=64, budget=64, caching=True)
    first = seq(1, list(range(12)), max_tokens=1)
    sched.add(first)
    run_step(sched, kv)
    assert first.is_finished
    again = seq(2, list(range(12)) + [50], max_tokens=1)
    hits = kv.find_cached_prefix(again)
    assert len(hits) == 3  # all three full blocks of the shared 12 tokens
    # every hash colliding: the token check must still refuse a block with other tokens
    monkeypatch.setattr(kv_module, "_chain_hash", lambda parent, tokens: 42)
    kv2 = KVCacheManager(64, BS, True)
    s1 = seq(3, [1, 2, 3, 4, 5], max_tokens=1)
    kv2.allocate(s1, 5)
    s1.num_computed_tokens = 5
    kv2.cache_full_blocks(s1)
    assert kv2.find_cached_prefix(seq(4, [9, 9, 9, 9, 9])) == []
    assert kv2.find_cached_prefix(seq(5, [1, 2, 3, 4, 5])) == s1.block_table[:1]


def test_at_least_one_token_is_recomputed():
    kv, sched = make(num_blocks=64, budget=64, caching=True)
    s = seq(1, list(range(8)), max_tokens=1)
    sched.add(s)
    run_step(sched, kv)
    # the same 8 tokens again: both blocks are cached, but the last token's logits are needed
    assert len(kv.find_cached_prefix(seq(2, list(range(8))))) == 1


def test_unreferenced_cached_blocks_are_evicted_lru():
    kv = KVCacheManager(4, BS, True)
    old = seq(1, [1, 2, 3, 4, 5, 6, 7, 8])
    kv.allocate(old, 8)
    old.num_computed_tokens = 8
    kv.cache_full_blocks(old)
    old_blocks = list(old.block_table)
    kv.free(old)
    assert kv.num_free_blocks == 4 and len(kv.cached) == 2
    newer = seq(2, list(range(100, 112)))  # needs 3 blocks: the 2 free ones, then one eviction
    assert kv.allocate(newer, 12)
    # the tail block of `old` went first (freed in reverse), its prefix block is still cached
    assert old_blocks[1] in newer.block_table and old_blocks[0] not in newer.block_table
    assert kv.find_cached_prefix(seq(3, [1, 2, 3, 4, 5])) == [old_blocks[0]]
    assert not kv.allocate(seq(4, list(range(20))), 20)  # too big: refused, nothing changed
    assert kv.num_free_blocks == 1


@pytest.mark.parametrize("bad", [dict(max_model_len=0), dict(block_size=-1),
                                 dict(gpu_memory_utilization=1.5)])
def test_engine_config_errors(bad):
    kwargs = dict(max_model_len=128) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        EngineConfig(**kwargs)
