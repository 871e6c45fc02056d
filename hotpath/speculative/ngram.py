"""N-gram prompt lookup: drafts copied from the sequence's own context, no weights.

The longest suffix of the context (prompt_lookup_max tokens down to prompt_lookup_min) that
occurred earlier is looked up, and the tokens that followed its most recent earlier occurrence
are the drafts. It pays where outputs repeat their input: code edits, quoting, extraction.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def ngram_propose(tokens: list[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k drafts for the context `tokens` (empty where no suffix of min_n..max_n tokens
    occurred before)."""
    ctx = np.asarray(tokens, dtype=np.int64)  # [L]
    L = len(ctx)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        # every window of n tokens that has a token after it, compared with the last n tokens
        windows = sliding_window_view(ctx[:-1], n)  # [L - n, n]
        hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
        if len(hits):
            start = hits[-1] + n  # the token after the most recent earlier occurrence
            return ctx[start : start + k].tolist()
    return []
