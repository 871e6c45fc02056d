"""The hybrid models' snapshot bookkeeping: which boundaries a step saves, what is registered when,
the least-recently-used eviction (never of a snapshot this step restores), and snapshots dropped
with their KV block."""

from hotpath.engine.sequence import Sequence
from hotpath.engine.state_snapshots import StateSnapshots
from hotpath.sampling_params import SamplingParams

BS = 16


def seq(prompt_len: int, hashes: int) -> Sequence:
    s = Sequence(seq_id=0, request_id="r", index=0, prompt_token_ids=list(range(prompt_len)), params=SamplingParams(), max_tokens=100, stop_token_ids=set())
    s.block_hashes = [1000 + i for i in range(hashes)]
    return s


def test_saves_at_the_last_boundary_of_a_step():
    snaps = StateSnapshots(num_snapshots=4, block_size=BS, stride_blocks=64)
    s = seq(70, 6)
    snaps.plan_save(s, 0, 40, set())  # boundaries 16 and 32 inside: the last one, 32 tokens in
    assert s.save_at == (32, s.snapshot) and s.snapshot_boundary == 32
    s.save_at = None
    snaps.plan_save(s, 40, 47, set())  # no boundary inside
    assert s.save_at is None
    snaps.plan_save(s, 47, 48, set())  # a decode token landing on 48: after it
    assert s.save_at == (1, s.snapshot) and not snaps.registered


def test_prompt_end_and_finish_are_registered():
    snaps = StateSnapshots(num_snapshots=4, block_size=BS, stride_blocks=64)
    s = seq(70, 6)
    snaps.plan_save(s, 0, 70, set())  # the prompt's last boundary: 64
    at_64 = s.snapshot
    snaps.plan_save(s, 79, 80, set())  # decoding past it: 64 is kept, a new pending one takes 80
    assert snaps.registered == {1003: at_64} and s.snapshot != at_64
    pending = s.snapshot
    snaps.release(s)  # finished: its last boundary, 80 (block 4's hash)
    assert snaps.registered[1004] == pending and s.snapshot is None
    assert snaps.lookup([1000, 1001, 1002, 1003, 1004, 1005]) == 5
    assert snaps.lookup([1000, 1001, 1002]) == 0


def test_lru_eviction_spares_this_steps_restores_and_follows_kv_eviction():
    snaps = StateSnapshots(num_snapshots=2, block_size=BS, stride_blocks=1)  # every boundary kept
    a, b = seq(40, 3), seq(40, 3)
    b.block_hashes = [2000, 2001, 2002]
    snaps.plan_save(a, 0, 16, set())
    snaps.release(a)  # registered under 1000
    snaps.plan_save(b, 0, 16, set())
    snaps.release(b)  # registered under 2000: the pool is full
    kept = snaps.restore_id(1000)  # 1000 is now the most recently used, and restored this step
    c = seq(40, 3)
    snaps.plan_save(c, 0, 16, {kept})
    assert 2000 not in snaps.registered and c.snapshot != kept  # the LRU other than the kept one
    snaps.forget_block(1000)  # its KV block evicted
    assert 1000 not in snaps.registered and kept in snaps.free_ids
    d = seq(40, 3)
    snaps.plan_save(d, 0, 16, set())
    assert d.snapshot == kept
    e = seq(40, 3)
    snaps.plan_save(e, 0, 16, {c.snapshot, d.snapshot})  # nothing free, nothing evictable
    assert e.save_at is None and e.snapshot is None
