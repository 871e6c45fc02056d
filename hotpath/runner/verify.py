"""Verify steps of speculative decoding: the target's tokens for each row's drafts, eagerly from the
step's logits (the rejection sampler) or from a graph of rows of 1 + K tokens."""

from __future__ import annotations

import torch

from hotpath.runner.plan import SampledToken
from hotpath.runner.row_graphs import RowGraphs
from hotpath.runner.seq_state import SeqState, is_plain_greedy
from hotpath.runner.step_types import LaunchedStep


class Verify:
    """ModelRunner's verify steps: reads its row graphs, block size, device and K."""

    def _verify(self, scheduled: list[tuple[SeqState, int]], sampling: list[SeqState],
                logits: torch.Tensor) -> LaunchedStep:
        """A verify step's tokens: each sequence's accepted drafts and one token more
        (hotpath/speculative/rejection.py), on the host when this returns."""
        from hotpath.speculative.rejection import verify_drafts

        verified = verify_drafts(
            logits,
            [s.draft_token_ids for s in sampling],
            [s.draft_probs for s in sampling],
            [s.params for s in sampling],
            [s.prompt_token_ids for s in sampling],
            [s.output_token_ids for s in sampling],
            [s.generator for s in sampling],
            [list(s.stop_token_ids) if s.params.min_tokens else [] for s in sampling],
        )
        tokens = {}
        for i, seq in enumerate(sampling):
            n = seq.params.logprobs or 0
            tops = verified.top_logprobs[i] if verified.top_logprobs is not None and n else None
            tokens[seq.seq_id] = [SampledToken(t, lp, tops[j][:n] if tops else [])
                                  for j, (t, lp) in enumerate(zip(verified.token_ids[i], verified.logprobs[i]))]
        return LaunchedStep(scheduled, sampling, None, [], None, verified=tokens)

    def _verify_in_graph(self, scheduled: list[tuple[SeqState, int]], mask_follows: bool) -> LaunchedStep | None:
        """A verify step as a graph of rows of q = 1 + K tokens, when every row is a decode or
        verify row (its last token, on the host, and its drafts) whose blocks hold q tokens (rows
        with fewer drafts pad); None to run it eagerly. Plain greedy rows take the
        graph's argmax as the target's tokens (accepted while they equal the drafts), the rest go
        through the rejection sampler on the graph's logits (after the step's token mask, where
        `mask_follows`: ModelRunner.sample)."""
        graphs = self.spec_graphs(draft=False, query_len=1 + self.num_speculative_tokens)
        if graphs is None or len(scheduled) > graphs.max_rows:
            return None
        q, bs, max_len = graphs.query_len, self.block_size, self.engine_config.max_model_len
        if any(  # padding stays inside the blocks the scheduler gave the row
            n != 1 + len(seq.draft_token_ids) or seq.num_computed_tokens + 1 != seq.num_known_tokens
            or seq.num_pending_tokens or seq.num_computed_tokens + q > min(len(seq.block_table) * bs, max_len)
            for seq, n in scheduled
        ):
            return None
        seqs = [seq for seq, _ in scheduled]
        rows = [(seq.num_computed_tokens, [seq.token_at(seq.num_computed_tokens)] + seq.draft_token_ids)
                for seq in seqs]
        logits, ids, logprobs = graphs.run(seqs, rows)  # [n * q, vocab], [n * q], [n * q]
        if not all(is_plain_greedy(seq) for seq in seqs):
            index = [i * q + j for i, (_, tokens) in enumerate(rows) for j in range(len(tokens))]
            logits = logits[torch.tensor(index).to(self.device, non_blocking=True)]
            step = LaunchedStep(scheduled, seqs, None, [], None, logits=logits, verifies=True)
            return step if mask_follows else self._verify(scheduled, seqs, logits)
        ids, logprobs = ids.tolist(), logprobs.tolist()  # the step's one host synchronisation
        tokens = {}
        for i, seq in enumerate(seqs):
            drafts = seq.draft_token_ids
            target = ids[i * q : i * q + 1 + len(drafts)]  # the target's token after each input
            kept = next((j for j, d in enumerate(drafts) if d != target[j]), len(drafts)) + 1
            tokens[seq.seq_id] = [SampledToken(t, lp, []) for t, lp in zip(target[:kept], logprobs[i * q :])]
        return LaunchedStep(scheduled, seqs, None, [], None, verified=tokens)

    def spec_graphs(self, draft: bool, query_len: int) -> RowGraphs | None:
        """The graphs of the target's (or the draft model's) forwards over rows of `query_len`
        tokens, or None where those steps run eagerly (_capture_spec_graphs)."""
        return self.row_graphs.get((draft, query_len))
