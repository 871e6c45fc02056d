"""Batch building: a forward's flat token batch (runner inputs and ForwardBatch) from rows of tokens
over each sequence's block table."""

from __future__ import annotations

import torch

from hotpath.layers.forward_batch import ForwardBatch
from hotpath.ops.attention import DECODE_MAX_QUERY_LEN
from hotpath.runner.seq_state import SeqState
from hotpath.runner.step_types import LaunchedStep, Row


class BatchBuilding:
    """ModelRunner's batches: reads its device, block size, state layers and MTP head."""

    def _prepare(
        self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, ForwardBatch, list[SeqState], list[tuple[SeqState, int, int, int]] | None]:
        """The step's flat batch tensors, and the sequences that sample, in row order. A decode
        row whose input token is still pending takes it from `prev`'s sampled ids on the device.
        A sequence with drafts (speculative decoding) feeds them after its last token and gets
        logits at each of them too (a verify step)."""
        rows: list[Row] = []
        pending: list[tuple[SeqState, int]] = []  # (sequence, row) of pending input tokens
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            drafts = seq.draft_token_ids
            end = start + num_new - len(drafts)  # past the sequence's own tokens
            if end > seq.num_known_tokens:  # only a decode's one token can be pending
                assert num_new == 1 and prev is not None, "a pending input token without its step"
                pending.append((seq, len(rows)))
                tokens = [0]
            else:
                tokens = seq.all_token_ids[start:end] + drafts
            rows.append(Row(seq, start, tokens, 1 + len(drafts) if end == seq.num_tokens else 0))
        ids, positions, batch, order = self.rows_batch(rows, state=True)
        if pending:
            at = {r: batch.cu_query_lens_host[i] for i, r in enumerate(order)}  # row -> first token
            index = torch.tensor([at[r] for _, r in pending], dtype=torch.int64)
            rows_prev = torch.tensor(prev.rows_of([seq for seq, _ in pending]), dtype=torch.int64)
            ids[index.to(self.device, non_blocking=True)] = prev.token_ids[rows_prev.to(self.device, non_blocking=True)]
        placed = None if self.mtp is None else [  # each row's tokens in the batch, for the MTP head
            (rows[r].seq, rows[r].first, len(rows[r].tokens), batch.cu_query_lens_host[i]) for i, r in enumerate(order)]
        return ids, positions, batch, [rows[r].seq for r in order if rows[r].num_logits], placed

    def rows_batch(self, rows: list[Row], state: bool = False) -> tuple[torch.Tensor, torch.Tensor, ForwardBatch, list[int]]:
        """A forward's flat batch from rows of tokens at positions over each sequence's block
        table: (input ids, positions, batch, the rows' order in it). Few-query rows go first, so
        a mixed step's attention splits there (ForwardBatch.split); `batch.logits_indices` lists
        each row's last `num_logits` tokens, in that order. `state`: the rows are the model's own
        step, whose hybrid state slots and snapshots the batch carries."""
        order = sorted(range(len(rows)), key=lambda r: len(rows[r].tokens) > DECODE_MAX_QUERY_LEN)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_query_lens = [0]
        context_lens: list[int] = []
        logits_indices: list[int] = []
        bs = self.block_size
        visual_rows: list[tuple[SeqState, int, int, int]] = []  # rows holding visual tokens
        thw: list[tuple[int, int, int]] = []  # their mRoPE ids, in the rows past the RoPE table
        for r in order:
            seq, start, tokens, num_logits = rows[r]
            end = start + len(tokens)
            if state and seq.mrope is not None:  # the model's own step (not a draft model's)
                ids, visual = seq.mrope.positions(start, end)
                if visual:
                    visual_rows.append((seq, start, end, len(input_ids)))
                    for i, t, h, w in visual:
                        ids[i] = self.mrope_row0 + len(thw)
                        thw.append((t, h, w))
                positions.extend(ids)
            else:
                positions.extend(range(start, end))
            input_ids.extend(tokens)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            cu_query_lens.append(cu_query_lens[-1] + len(tokens))
            context_lens.append(end)
            logits_indices.extend(range(cu_query_lens[-1] - num_logits, cu_query_lens[-1]))
        seqs = [rows[r].seq for r in order]
        max_blocks = max(len(seq.block_table) for seq in seqs)
        block_tables = [seq.block_table + [0] * (max_blocks - len(seq.block_table)) for seq in seqs]

        def t(data: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(data, dtype=dtype, device="cpu").to(self.device, non_blocking=True)

        scheduled = [(rows[r].seq, len(rows[r].tokens)) for r in order]
        stateful = state and bool(self.state_layers)
        verify_rows = verify_tokens = None
        if stateful:  # verify rows (drafts after the last token): rolled back after acceptance
            verify_rows = [i for i, seq in enumerate(seqs) if seq.draft_token_ids]
            self._verify_rows = {seqs[i].seq_id: (j, len(rows[order[i]].tokens))
                                 for j, i in enumerate(verify_rows)}
            if verify_rows:
                verify_tokens = t([p for i in verify_rows for p in range(cu_query_lens[i], cu_query_lens[i + 1])],
                                  torch.int64)
        state_slots = None
        if stateful:
            state_slots = t([seq.state_slot for seq in seqs], torch.int64)
        elif not state and self.draft_state_layers:
            state_slots = t(self._draft_state_slots([rows[r] for r in order]), torch.int64)
        batch = ForwardBatch(
            cu_query_lens=t(cu_query_lens, torch.int32),
            context_lens=t(context_lens, torch.int32),
            block_tables=t(block_tables, torch.int32),
            slot_mapping=t(slots, torch.int64),
            logits_indices=t(logits_indices, torch.int64),
            max_query_len=max(n for _, n in scheduled),
            max_context_len=max(context_lens),
            state_slots=state_slots,
            state_saves=self._state_saves(scheduled) if stateful else None,
            cu_query_lens_host=cu_query_lens,
            verify_rows=verify_rows or None,
            verify_tokens=verify_tokens,
        )
        if visual_rows:
            self.mrope_table.write_mrope_rows(t(thw, torch.int64))
            batch.visual = self._visual_embeds(visual_rows)
        num_few = sum(1 for _, n in scheduled if n <= DECODE_MAX_QUERY_LEN)
        if 0 < num_few < len(scheduled):
            batch.split = self._split_batch(batch, num_few, cu_query_lens, context_lens, scheduled)
        return t(input_ids, torch.int64), t(positions, torch.int64), batch, order

    def _draft_state_slots(self, rows: list[Row]) -> list[int]:
        """A hybrid draft model's forward (rows_batch without `state`): each row's slot in the
        draft's state pools. Rows of the sequence's own tokens (catching up) run on its slot; rows
        of drafts (at or past num_tokens) on its second slot, copied from the first at the first
        draft, so the next catch-up continues from the state after the sequence's tokens only."""
        n = self.num_state_slots
        slots, forks = [], []
        for seq, first, _, _ in rows:
            if first < seq.num_tokens:
                slots.append(seq.state_slot)
                continue
            slots.append(n + 1 + seq.state_slot)
            if first == seq.num_tokens:
                forks.append(seq.state_slot)
        if forks:
            src = torch.tensor(forks, dtype=torch.int64).to(self.device, non_blocking=True)
            for layer in self.draft_state_layers:
                layer.copy_states(src, src + (n + 1))
        return slots

    def _split_batch(
        self, batch: ForwardBatch, num_few: int, cu_query_lens: list[int], context_lens: list[int],
        scheduled: list[tuple[SeqState, int]],
    ) -> tuple[int, ForwardBatch, ForwardBatch]:
        """A mixed step's (decode tokens, decode part, prefill part): views of the step's tensors,
        but for the prefill part's query offsets, which start again from 0."""
        num_few_tokens = cu_query_lens[num_few]
        no_logits = batch.logits_indices[:0]
        few = ForwardBatch(
            cu_query_lens=batch.cu_query_lens[: num_few + 1],
            context_lens=batch.context_lens[:num_few],
            block_tables=batch.block_tables[:num_few],
            slot_mapping=batch.slot_mapping[:num_few_tokens],
            logits_indices=no_logits,
            max_query_len=max(n for _, n in scheduled[:num_few]),
            max_context_len=max(context_lens[:num_few]),
        )
        rest = ForwardBatch(
            cu_query_lens=torch.tensor([c - num_few_tokens for c in cu_query_lens[num_few:]],
                                       dtype=torch.int32).to(self.device, non_blocking=True),
            context_lens=batch.context_lens[num_few:],
            block_tables=batch.block_tables[num_few:],
            slot_mapping=batch.slot_mapping[num_few_tokens:],
            logits_indices=no_logits,
            max_query_len=max(n for _, n in scheduled[num_few:]),
            max_context_len=max(context_lens[num_few:]),
        )
        return num_few_tokens, few, rest
