"""The data-parallel routing rule on its own: prefix affinity, the load margin, LRU bounds."""

import pytest

from hotpath.engine.dp_router import PrefixRouter, Route


def route(router: PrefixRouter, ids: list[int], loads: list[int]) -> Route:
    hashes = router.block_hashes(ids)
    chosen = router.choose(hashes, loads)
    router.record(hashes, chosen)
    return chosen


def test_idle_replicas_take_turns_and_a_shared_prefix_follows_its_replica():
    router = PrefixRouter(num_replicas=3, block_size=4, capacity=100)
    a, b, c = list(range(12)), list(range(100, 112)), list(range(200, 212))
    assert [route(router, p, [0, 0, 0]).replica for p in (a, b, c)] == [0, 1, 2]
    # same first two blocks as b, a different third one: b's replica, two blocks matched
    assert route(router, b[:8] + [7, 7, 7, 7, 9], [0, 0, 0]) == Route(1, 2)
    assert router.routed == [1, 2, 1] and router.prefix_routed == [0, 1, 0]
    # shorter than a block: nothing to match, the least-loaded replica
    assert route(router, b[:3], [1, 0, 1]) == Route(1, 0)


def test_the_longest_match_wins_and_the_load_margin_overrides_it():
    router = PrefixRouter(num_replicas=2, block_size=2, capacity=100, load_margin=2)
    route(router, [1, 2], [0, 0])  # one block on replica 0
    route(router, [1, 2, 3, 4, 5, 6], [5, 0])  # busy replica 0: to 1, which now has three blocks
    assert router.choose(router.block_hashes([1, 2, 3, 4, 9, 9]), [0, 0]) == Route(1, 2)
    assert router.choose(router.block_hashes([1, 2, 3, 4]), [0, 2]).replica == 1  # within the margin
    assert router.choose(router.block_hashes([1, 2, 3, 4]), [0, 3]) == Route(0, 0)  # past it


def test_the_table_forgets_least_recently_routed_blocks_first():
    router = PrefixRouter(num_replicas=2, block_size=1, capacity=3)
    route(router, [1, 2], [0, 0])  # replica 0
    route(router, [5, 6], [0, 0])  # replica 1; evicts block [1]
    assert len(router) == 3
    assert router.choose(router.block_hashes([1, 2]), [0, 0]).matched_blocks == 0
    assert router.choose(router.block_hashes([5, 6]), [0, 0]) == Route(1, 2)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one replica"):
        PrefixRouter(num_replicas=0, block_size=16, capacity=10)
    with pytest.raises(ValueError, match="expected 2 loads"):
        PrefixRouter(num_replicas=2, block_size=16, capacity=10).choose([], [0])
