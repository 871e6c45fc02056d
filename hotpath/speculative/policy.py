"""How many drafts a step verifies: chosen each step from measured acceptance and measured step
times, so that speculation is off (k = 0, a plain decode step) wherever it does not pay.

Model. A sequence whose drafts are accepted with probability a each (its running mean) emits
E(k) = 1 + a + ... + a^k tokens in a step that verifies k drafts. A step of batch size B with
k drafts takes T(B, k), measured: the engine times its decode steps (pure decode, no prefill
chunk) and keeps a running mean per (batch-size bucket, k). The step takes the k in 0..K that
maximises sum(E_s(k)) / T(B, k). T(B, k) not measured yet is interpolated linearly between the
measured k nearest below and above (verify and draft work grow about linearly in k), and where
only one side is known the step explores: k = K until T(B, K) is measured (in pure decode steps:
while prompts prefill beside them, k = 0; and only while even free drafts would add MIN_GAIN
tokens a sequence), then k = 0. The first step timed of each (bucket, k) is dropped (it
compiles kernels, allocates). When k = 0 wins, acceptance is no longer observed, so after
EXPLORE_EVERY decode steps at that bucket (the next pure decode step) one verifies K drafts
again, to see whether it has come to pay (outputs are exact either way: only the speed
changes); each such step that finds it still does not pay doubles the interval
(up to MAX_EXPLORE_EVERY), since each costs a verify step's time for about one token. Its whole
time is measured too (a draft model first catches up on every token of the plain steps, its
prompt's as well): the next one waits long enough that what it cost beyond a plain step is at
most EXPLORE_BUDGET of the plain steps' time in between; and a draft model's catch-up, timed
a token whenever it is long (a prompt), is predicted: a re-measurement waits until the tokens
it would catch up on cost at most that share of the plain steps' time since the last one.

A new sequence starts from the running mean acceptance of every sequence's rows so far (the
workload's; PRIOR_ACCEPTANCE before any), so that new requests on a server whose drafts miss are
not each tried anew. A sequence given draft slots for which the drafter proposed nothing (no
n-gram match) counts as a draft rejected: such a step gained nothing, and waited for the step
before it (a drafter needs its tokens), where a plain step would not have.
"""

from __future__ import annotations

import math

from hotpath.runner.seq_state import SeqState

EXPLORE_EVERY = 50  # decode steps before speculation is re-measured while it is off; doubled
MAX_EXPLORE_EVERY = 800  # after each re-measurement that finds it still does not pay, up to this
EXPLORE_BUDGET = 0.01  # of the plain steps' time: what an exploration may cost beyond one of them
EMA = 0.1  # weight of a new measurement in a running mean
PRIOR_ACCEPTANCE = 0.5  # a new sequence's acceptance before any has been measured
CATCH_UP_TIMED = 64  # tokens: a drafter's catch-up at least this long is timed, a token
MIN_GAIN = 0.05  # tokens a sequence a step that drafts must promise (free of cost) to be tried


def bucket(batch_size: int) -> int:
    """Batch sizes measured together: powers of two (1, 2, 4, ...)."""
    return 1 << (batch_size - 1).bit_length()


class DraftLengthPolicy:
    def __init__(self, max_drafts: int, adaptive: bool = True) -> None:
        self.max_drafts = max_drafts
        self.adaptive = adaptive
        self.step_time: dict[tuple[int, int], float] = {}  # (bucket, k) -> seconds, running mean
        self.acceptance: dict[int, float] = {}  # seq_id -> running mean acceptance of a draft
        self.prior = PRIOR_ACCEPTANCE  # a new sequence's: the running mean over every sequence's rows
        self.steps_off: dict[int, int] = {}  # bucket -> decode steps since speculation last ran
        self.explore_every: dict[int, int] = {}  # bucket -> steps between re-measurements now
        self.first_seen: set[tuple[int, int]] = set()  # (bucket, k) timed once (that step is not kept)
        self.exploring: int | None = None  # the bucket whose re-measurement this step is
        self.catch_up_cost: float | None = None  # seconds a token a drafter catches up on, running mean

    def choose(self, seqs: list[SeqState], prefilling: bool = False, behind: int = 0) -> int:
        """The number of drafts this step's decoding sequences verify. `prefilling`: prompts
        may run beside them (a step that is not timed: nothing unmeasured is tried then);
        `behind`: the tokens the drafter would catch up on before drafting for them."""
        if not self.adaptive or not seqs:
            return self.max_drafts
        b, K = bucket(len(seqs)), self.max_drafts
        accept = [self.acceptance.get(s.seq_id, self.prior) for s in seqs]
        if (b, K) not in self.step_time:  # explored, unless even free drafts would gain nothing
            if self._tokens(accept, K) >= (1 + MIN_GAIN) * len(seqs):
                return 0 if prefilling else K
            best = 0
        elif (b, 0) not in self.step_time:
            return 0
        else:
            best = max(range(K + 1), key=lambda k: self._tokens(accept, k) / self._time(b, k))
        if best == 0:
            self.steps_off[b] = self.steps_off.get(b, 0) + 1
            every = self.explore_every.get(b, EXPLORE_EVERY)
            if self.steps_off[b] >= every and not prefilling and self._catch_up_fits(b, behind):
                self.steps_off[b] = 0
                self.explore_every[b] = max(every, min(2 * every, MAX_EXPLORE_EVERY))
                self.exploring = b
                return K
        else:
            self.explore_every.pop(b, None)
        return best

    @staticmethod
    def _tokens(accept: list[float], k: int) -> float:
        return sum(sum(a**i for i in range(k + 1)) for a in accept)

    def _time(self, b: int, k: int) -> float:
        if (b, k) in self.step_time:
            return self.step_time[(b, k)]
        lo = max(j for j in range(k) if (b, j) in self.step_time)
        hi = min(j for j in range(k + 1, self.max_drafts + 1) if (b, j) in self.step_time)
        t_lo, t_hi = self.step_time[(b, lo)], self.step_time[(b, hi)]
        return t_lo + (t_hi - t_lo) * (k - lo) / (hi - lo)

    def record_step(self, batch_size: int, k: int, seconds: float) -> None:
        """A pure decode step of batch_size sequences that verified up to k drafts each."""
        key = (bucket(batch_size), k)
        if key not in self.first_seen:  # a first step of its kind warms up (compiles, allocates)
            self.first_seen.add(key)
            return
        old = self.step_time.get(key)
        self.step_time[key] = seconds if old is None else old + EMA * (seconds - old)

    def _catch_up_fits(self, b: int, behind: int) -> bool:
        plain = self.step_time.get((b, 0))
        if self.catch_up_cost is None or plain is None:
            return True
        return self.catch_up_cost * behind <= EXPLORE_BUDGET * self.steps_off[b] * plain

    def record_catch_up(self, tokens: int, seconds: float) -> None:
        """A drafter ran through `tokens` tokens (at least CATCH_UP_TIMED) and drafted in `seconds`."""
        cost = seconds / tokens
        old = self.catch_up_cost
        self.catch_up_cost = cost if old is None else old + EMA * (cost - old)

    def record_exploration(self, seconds: float) -> None:
        """The whole time of the re-measurement step choose() last returned."""
        b, self.exploring = self.exploring, None
        plain = self.step_time.get((b, 0))
        if plain is not None:
            steps = math.ceil((seconds - plain) / (EXPLORE_BUDGET * plain))
            self.explore_every[b] = max(self.explore_every[b], steps)

    def record_acceptance(self, seq: SeqState, drafts: int, accepted: int) -> None:
        """A verify row: `accepted` of `drafts` kept (a draft after a rejection is not tried)."""
        self._update(seq, accepted / min(drafts, accepted + 1))

    def record_no_drafts(self, seq: SeqState) -> None:
        """Draft slots the drafter filled with nothing (no n-gram match): counted as a miss."""
        self._update(seq, 0.0)

    def _update(self, seq: SeqState, rate: float) -> None:
        old = self.acceptance.get(seq.seq_id, self.prior)
        self.acceptance[seq.seq_id] = old + 0.3 * (rate - old)
        self.prior += EMA * (rate - self.prior)

    def forget(self, seq: SeqState) -> None:
        self.acceptance.pop(seq.seq_id, None)
