"""Hybrid models' state slots are sized to the memory: max_num_seqs of them where they fit in half
the budget (with prefix caching, a snapshot each as well), fewer where not, a clear error where
not even one fits."""

import pytest

from hotpath.runner.memory import state_slots_that_fit

MB = 2**20


def test_all_sequences_when_they_fit():
    assert state_slots_that_fit(256, 63 * MB, True, 80e9) == 256
    assert state_slots_that_fit(256, 63 * MB, False, 40e9) == 256


def test_fewer_slots_where_max_num_seqs_would_not_fit():
    # Qwen3.5-27B's shape: 48 linear-attention layers of 48 x 128 x 128 fp32 states, ~151 MB a
    # sequence; ~70 GB left after its weights on an H200 at the default utilisation
    per_slot = 48 * (48 * 128 * 128 * 4 + 10240 * 3 * 2)
    slots = state_slots_that_fit(256, per_slot, True, 70e9)
    assert slots < 256
    assert (2 * slots + 1) * per_slot <= 35e9 < (2 * (slots + 1) + 1) * per_slot
    assert state_slots_that_fit(256, per_slot, False, 70e9) in (2 * slots, 2 * slots + 1)


def test_error_when_not_one_fits():
    with pytest.raises(ValueError, match="no memory left for even one sequence's linear-attention state"):
        state_slots_that_fit(256, 151 * MB, True, 500 * MB)
