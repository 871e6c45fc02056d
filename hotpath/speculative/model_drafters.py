"""The drafters that run a model, on the workers beside the target: a smaller draft model of the
same tokenizer, and the checkpoint's multi-token-prediction head. Each sets a sequence's
`draft_token_ids` and `draft_probs` (see speculative/drafters.py)."""

from __future__ import annotations

import torch

from hotpath.runner.model_runner import ModelRunner
from hotpath.runner.sampler import probabilities, process_logits
from hotpath.runner.seq_state import SeqState, is_plain_greedy
from hotpath.runner.step_types import LaunchedStep, Row
from hotpath.speculative.config import SpeculativeConfig
from hotpath.speculative.drafters import Drafter


def draft_tokens(logits: torch.Tensor, sampling: list[SeqState], probs: dict[int, list[torch.Tensor]]) -> None:
    """Appends each row's next draft to its sequence (logits [rows, target vocab], rows in the
    order of `sampling`): the processed argmax for greedy requests, else a sample of the processed
    distribution q, which is kept in probs[seq_id] for the rejection sampler."""
    params = [s.params for s in sampling]
    history = [s.output_token_ids + s.draft_token_ids for s in sampling]
    logits = process_logits(logits, params, [s.prompt_token_ids for s in sampling], history,
                            [list(s.stop_token_ids) if s.params.min_tokens else [] for s in sampling])
    tokens = logits.argmax(dim=-1)  # [rows]: greedy requests draft the draft's argmax
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        q = probabilities(logits[index], [params[i] for i in sampled])  # [sampled, vocab]
        for j, i in enumerate(sampled):
            seq = sampling[i]
            tokens[i] = torch.multinomial(q[j], 1, generator=seq.generator)[0]
            probs[seq.seq_id].append(q[j])
    for seq, token in zip(sampling, tokens.tolist()):
        seq.draft_token_ids.append(token)


def set_draft_probs(seqs: list[SeqState], probs: dict[int, list[torch.Tensor]]) -> None:
    for seq in seqs:
        if probs[seq.seq_id] and not seq.params.greedy:
            seq.draft_probs = torch.stack(probs[seq.seq_id])  # [k, vocab]


# a draft model at most this many windows of 1 + K tokens behind catches up in graphs (after a
# few steps without drafts); further behind (a prompt) in one eager forward
GRAPH_CATCH_UP_WINDOWS = 8


class DraftModelDrafter(Drafter):
    """A smaller model of the same tokenizer drafts autoregressively. Its K/V live in the
    runner's draft cache under the target's block tables (the same block ids, its own tensors),
    so the target's block bookkeeping (allocation, rollback, preemption) covers it. Each step it
    first catches up on the sequence's tokens it has not seen (a whole prompt after a prefill,
    else the last step's accepted tokens), chunked by the token budget, which gives its first
    draft; then it runs one token at a time for the rest. Where graphs are captured and every
    sequence drafts greedily (plain greedy), the catch-up is graphs over windows of K + 1 tokens
    (the last ending at the sequence's last token, recomputing K/V it had seen: the same values)
    when it is at most GRAPH_CATCH_UP_WINDOWS of them behind, and the one-token steps are graphs
    whose inputs are the last step's argmax on the device: the drafts reach the host once."""

    def __init__(self, runner: ModelRunner, max_tokens_per_forward: int) -> None:
        assert runner.draft_model is not None
        self.runner = runner
        self.model = runner.draft_model
        self.vocab_size = runner.model_config.vocab_size  # the target's: draft rows are cut or padded to it
        self.draft_vocab_size = runner.draft_model.model.embed_tokens.weight.shape[0]
        self.max_tokens = max_tokens_per_forward

    @torch.inference_mode()
    def propose(self, seqs: list[SeqState], slots: list[int]) -> None:
        for seq in seqs:
            seq.draft_token_ids, seq.draft_probs = [], None
        probs: dict[int, list[torch.Tensor]] = {seq.seq_id: [] for seq in seqs}
        k = max(slots, default=0)
        if k and all(is_plain_greedy(seq) for seq in seqs) and self._in_graphs(seqs, slots):
            return
        self._catch_up(seqs, probs)
        # then one token at a time
        for i in range(1, k):
            rows = [Row(seq, seq.num_tokens + i - 1, seq.draft_token_ids[-1:], 1)
                    for seq, n in zip(seqs, slots) if n > i]
            self._step(rows, probs)
        set_draft_probs(seqs, probs)

    def behind(self, seqs: list[SeqState]) -> int:
        return sum(seq.num_tokens - seq.num_draft_computed for seq in seqs)

    def _in_graphs(self, seqs: list[SeqState], slots: list[int]) -> bool:
        """Greedy drafts for each sequence through graphs (see the class doc): as many as the
        most slots for every row, each cut to its own; False, having done nothing, where a step
        is too big for them, a row's drafts would pass its blocks, or there are no graphs."""
        q = 1 + self.runner.num_speculative_tokens  # the catch-up graphs' rows: 1 + K tokens
        catch_up = self.runner.spec_graphs(draft=True, query_len=q)
        one = self.runner.spec_graphs(draft=True, query_len=1)
        k, bs, max_len = max(slots), self.runner.block_size, self.runner.engine_config.max_model_len
        if catch_up is None or len(seqs) > catch_up.max_rows or any(
                seq.num_tokens + k - 1 > min(len(seq.block_table) * bs, max_len) for seq in seqs):
            return False
        n = len(seqs)
        drafts = torch.empty((n, k), dtype=torch.int64, device=self.runner.device)
        far = max(seq.num_tokens - seq.num_draft_computed for seq in seqs)  # tokens to catch up on
        if far <= GRAPH_CATCH_UP_WINDOWS * q and all(seq.num_tokens >= q for seq in seqs):
            # windows of q tokens from the first unseen one, the last ending at the last token; a
            # sequence with fewer windows repeats its last (the same K/V again)
            top = self.draft_vocab_size - 1  # the target's extra ids, unknown to the draft
            starts = [[min(p, seq.num_tokens - q) for p in range(seq.num_draft_computed, seq.num_tokens, q)]
                      or [seq.num_tokens - q] for seq in seqs]
            for j in range(max(map(len, starts))):
                rows = []
                for seq, at in zip(seqs, starts):
                    first = at[min(j, len(at) - 1)]
                    rows.append((first, [min(t, top) for t in seq.all_token_ids[first : first + q]]))
                _, ids, _ = catch_up.run(seqs, rows)  # [n * q]: the argmax after each token
            last = [i * q + q - 1 for i in range(n)]
            drafts[:, 0] = ids.view(n, q)[:, -1]
            prev = (ids, last)
        else:  # far behind (after a prefill): eagerly, as without graphs
            self._catch_up(seqs, {seq.seq_id: [] for seq in seqs})
            drafts[:, 0] = torch.tensor([seq.draft_token_ids[0] for seq in seqs])
            prev = None
        for seq in seqs:
            seq.num_draft_computed = seq.num_tokens
        for i in range(1, k):
            if prev is None:
                rows = [(seq.num_tokens, [seq.draft_token_ids[0]]) for seq in seqs]
            else:
                rows = [(seq.num_tokens + i - 1, []) for seq in seqs]
            _, ids, _ = one.run(seqs, rows, prev)  # [n]
            drafts[:, i] = ids
            prev = (ids, list(range(n)))  # in place: the graph wrote its argmax over its inputs
        top = self.vocab_size - 1  # a draft vocabulary wider than the target's
        for seq, row, n in zip(seqs, drafts.tolist(), slots):  # the drafts' one host synchronisation
            seq.draft_token_ids = [min(t, top) for t in row[:n]]
        return True

    def _catch_up(self, seqs: list[SeqState], probs: dict[int, list[torch.Tensor]]) -> None:
        """Runs each sequence through the tokens it has not seen, in forwards of at most
        max_tokens tokens, and takes its first draft from the last."""
        todo = list(seqs)
        while todo:
            budget, rows = self.max_tokens, []
            for seq in todo:
                n = min(seq.num_tokens - seq.num_draft_computed, budget)
                if n == 0:
                    break
                first = seq.num_draft_computed
                rows.append(Row(seq, first, seq.all_token_ids[first : first + n], int(first + n == seq.num_tokens)))
                budget -= n
            self._step(rows, probs)
            for row in rows:
                row.seq.num_draft_computed += len(row.tokens)
            todo = [seq for seq in todo if seq.num_draft_computed < seq.num_tokens]

    def _step(self, rows: list[Row], probs: dict[int, list[torch.Tensor]]) -> None:
        """One forward of the draft model over `rows`; each row with logits gets its next draft."""
        ids, positions, batch, order = self.runner.rows_batch(rows)
        if self.draft_vocab_size < self.vocab_size:  # the target's extra ids, unknown to the draft
            ids = ids.clamp(max=self.draft_vocab_size - 1)
        hidden = self.model(ids, positions, batch)
        sampling = [rows[r].seq for r in order if rows[r].num_logits]
        if not sampling:
            return
        logits = self.model.compute_logits(hidden[batch.logits_indices])  # [rows, draft vocab]
        if logits.shape[1] >= self.vocab_size:
            logits = logits[:, : self.vocab_size]
        else:  # a draft with fewer (padding) rows never proposes the target's extra ids
            logits = torch.nn.functional.pad(logits, (0, self.vocab_size - logits.shape[1]), value=float("-inf"))
        draft_tokens(logits, sampling, probs)


class MtpDrafter(Drafter):
    """The target checkpoint's multi-token-prediction head drafts (models/mtp.py): its row at
    position t takes the token at t + 1 and the target's final hidden state at t, and guesses the
    token at t + 2. Its K/V live under the target's block tables (as a draft model's).

    The target's hidden states exist only in the step that computed them, so the head catches up
    as each step's tokens reach the host (`collected`): over the step's rows (every prefill chunk
    too, and a verify row's kept tokens), whose next tokens are then known. That leaves it caught
    up to the position before a sequence's last token, its output there (kept per sequence)
    guessing the token after the last: the first draft. Each further draft is a row at the next
    position with the draft before it and the head's own output as the hidden state.

    (A prefix-cache hit skips the target over the cached tokens, and the head with it: their
    head K/V are those the sequence that cached the blocks wrote, whose token after a block's last
    position may have differed. Drafts only; outputs are exact whatever is drafted.)"""

    def __init__(self, runner: ModelRunner) -> None:
        assert runner.mtp is not None
        self.runner = runner
        self.mtp = runner.mtp
        self.last: dict[int, torch.Tensor] = {}  # seq_id -> the head's output at its last row [hidden]

    @torch.inference_mode()
    def collected(self, step: LaunchedStep, gone: set[int]) -> None:
        if step.hidden is None:
            return
        rows, spans = [], []
        for seq, first, count, offset in step.hidden_rows:
            if seq.seq_id in gone:  # finished or preempted: its blocks are gone
                continue
            # the positions whose next token is on the host: a verify row's kept tokens (the
            # rejected drafts were never appended), a prefill chunk's, a decode's
            n = min(count, seq.num_known_tokens - 1 - first)
            if n > 0:
                rows.append(Row(seq, first, [seq.token_at(p) for p in range(first + 1, first + 1 + n)], 1))
                spans.append(range(offset, offset + n))
        if not rows:
            return
        ids, positions, batch, order = self.runner.rows_batch(rows)
        index = torch.tensor([i for r in order for i in spans[r]]).to(step.hidden.device, non_blocking=True)
        out = self.mtp(ids, positions, batch, step.hidden[index])  # [tokens, hidden]
        last = out[batch.logits_indices]  # each row's last
        for i, r in enumerate(order):
            seq = rows[r].seq
            self.last[seq.seq_id] = last[i]
            seq.num_draft_computed = rows[r].first + len(rows[r].tokens)

    @torch.inference_mode()
    def propose(self, seqs: list[SeqState], slots: list[int]) -> None:
        for seq in seqs:
            seq.draft_token_ids, seq.draft_probs = [], None
        # caught up to the position before the last token (a sequence the head has not: no drafts)
        ready = [(seq, k) for seq, k in zip(seqs, slots)
                 if seq.seq_id in self.last and seq.num_draft_computed == seq.num_tokens - 1]
        if not ready:
            return
        probs: dict[int, list[torch.Tensor]] = {seq.seq_id: [] for seq, _ in ready}
        hidden = torch.stack([self.last[seq.seq_id] for seq, _ in ready])  # [rows, hidden]
        draft_tokens(self.mtp.compute_logits(hidden), [seq for seq, _ in ready], probs)
        for i in range(1, max(k for _, k in ready)):
            active = [j for j, (_, k) in enumerate(ready) if k > i]
            rows = [Row(ready[j][0], ready[j][0].num_tokens - 2 + i, ready[j][0].draft_token_ids[-1:], 1)
                    for j in active]
            ids, positions, batch, order = self.runner.rows_batch(rows)
            at = torch.tensor([active[r] for r in order], device=hidden.device)
            out = self.mtp(ids, positions, batch, hidden[at], step=i)  # [rows, hidden]
            hidden = hidden.index_copy(0, at, out)
            draft_tokens(self.mtp.compute_logits(out), [rows[r].seq for r in order], probs)
        set_draft_probs([seq for seq, _ in ready], probs)

    def forget(self, seq: SeqState) -> None:
        self.last.pop(seq.seq_id, None)


def make_drafter(config: SpeculativeConfig, runner: ModelRunner, max_tokens_per_forward: int) -> Drafter:
    """The worker's drafter for a method that runs a model ("draft_model", "mtp")."""
    if config.method == "mtp":
        return MtpDrafter(runner)
    return DraftModelDrafter(runner, max_tokens_per_forward)
