"""Drafters: what proposes the tokens a verify step checks.

A drafter sets `seq.draft_token_ids` (at most the number of draft slots the scheduler reserved)
and `seq.draft_probs`, the distribution each draft was drawn from ([k, vocab] float32 on the
device; None where drafts are point masses, as n-gram lookups are). Verification
(hotpath/runner/rejection.py) makes the output exactly the target's whatever a drafter proposes;
a drafter only decides how many tokens a step gains.
"""

from __future__ import annotations

from typing import Protocol

import torch

from hotpath.engine.sequence import Sequence
from hotpath.engine.spec.config import SpeculativeConfig
from hotpath.engine.spec.ngram import ngram_propose
from hotpath.runner.model_runner import ModelRunner, Row, is_plain_greedy
from hotpath.runner.sampler import probabilities, process_logits


class Drafter(Protocol):
    caught_up: int  # the most tokens the last propose() ran a sequence through before drafting

    def propose(self, seqs: list[Sequence], slots: list[int]) -> None:
        """Drafts for each decoding sequence, at most slots[i] of them."""


class NgramDrafter:
    caught_up = 0

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, seqs: list[Sequence], slots: list[int]) -> None:
        for seq, k in zip(seqs, slots):
            seq.draft_token_ids = ngram_propose(seq.all_token_ids, k, self.min_n, self.max_n)
            seq.draft_probs = None


class DraftModelDrafter:
    """A smaller model of the same tokenizer drafts autoregressively. Its K/V live in the
    runner's draft cache under the target's block tables (the same block ids, its own tensors),
    so the target's block bookkeeping (allocation, rollback, preemption) covers it. Each step it
    first catches up on the sequence's tokens it has not seen (a whole prompt after a prefill,
    else the last step's accepted tokens), chunked by the token budget, which gives its first
    draft; then it runs one token at a time for the rest. Where graphs are captured and every
    sequence drafts greedily (plain greedy, as many drafts each), the catch-up is a graph over each
    sequence's last K + 1 tokens (recomputing the K/V of those it had seen, the same values) when
    it is at most that far behind, and the one-token steps are graphs whose inputs are the last
    step's argmax on the device: the drafts reach the host once, at the end."""

    def __init__(self, runner: ModelRunner, max_tokens_per_forward: int) -> None:
        assert runner.draft_model is not None
        self.runner = runner
        self.model = runner.draft_model
        self.vocab_size = runner.model_config.vocab_size  # the target's: draft rows are cut or padded to it
        self.draft_vocab_size = runner.draft_model.model.embed_tokens.weight.shape[0]
        self.max_tokens = max_tokens_per_forward
        self.caught_up = 0

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], slots: list[int]) -> None:
        for seq in seqs:
            seq.draft_token_ids, seq.draft_probs = [], None
        probs: dict[int, list[torch.Tensor]] = {seq.seq_id: [] for seq in seqs}
        self.caught_up = max((seq.num_tokens - seq.num_draft_computed for seq in seqs), default=0)
        k = max(slots, default=0)
        if k and all(is_plain_greedy(seq) for seq in seqs) and self._in_graphs(seqs, slots):
            return
        self._catch_up(seqs, probs)
        # then one token at a time
        for i in range(1, k):
            rows = [Row(seq, seq.num_tokens + i - 1, seq.draft_token_ids[-1:], 1)
                    for seq, n in zip(seqs, slots) if n > i]
            self._step(rows, probs)
        for seq in seqs:
            if probs[seq.seq_id] and not seq.params.greedy:
                seq.draft_probs = torch.stack(probs[seq.seq_id])  # [k, vocab]

    def _in_graphs(self, seqs: list[Sequence], slots: list[int]) -> bool:
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
        if self.caught_up <= q and all(seq.num_tokens >= q for seq in seqs):
            top = self.draft_vocab_size - 1  # the target's extra ids, unknown to the draft
            rows = [(seq.num_tokens - q, [min(t, top) for t in seq.all_token_ids[-q:]]) for seq in seqs]
            _, ids, _ = catch_up.run(seqs, rows)  # [n * q]: the argmax after each token
            last = [i * q + q - 1 for i in range(n)]
            drafts[:, 0] = ids.view(n, q)[:, -1]
            prev = (ids, last)
        else:  # far behind (after a prefill or steps without drafts): eagerly, as without graphs
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

    def _catch_up(self, seqs: list[Sequence], probs: dict[int, list[torch.Tensor]]) -> None:
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


def make_drafter(config: SpeculativeConfig, runner: ModelRunner, max_tokens_per_forward: int) -> Drafter:
    if config.method == "ngram":
        return NgramDrafter(config)
    return DraftModelDrafter(runner, max_tokens_per_forward)
