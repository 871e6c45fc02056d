"""The decode graphs' integer inputs in one device buffer, written by one host-to-device copy a step.

A decode step's inputs are a few ints per row (token id, position, cache slot, context length;
a hybrid model's state slot) plus the block tables. They are built as one host list and sent in
one copy into one int32 device buffer that every graph's input tensors are views of (offsets in
int32 elements):

    [ row sources 2n | block tables s x w | out slot 2 | context lens s | positions 2sq | slots 2sq |
      state slots 2s | token ids ]   (token ids start at `ids_offset`)

Rows are `query_len` (q) tokens each: 1 for decode graphs; 1 + K for a speculative step's graphs
(a verify step's last token and up to K drafts; a draft model's catch-up over windows of q
tokens), whose rows with fewer tokens are padded to q at the positions after them, inside the
blocks the scheduler keeps for 1 + K tokens (their K/V and logits are never read).

The state slots (ForwardBatch.state_slots: each row's slot in the linear-attention layers' state
pools) are there only for hybrid models (`scratch_state_slot` given); otherwise that section is
empty. A graph of s rows reads the out slot, the s context lengths, positions, slots and state
slots that end at `ids_offset` and the first s token ids after it, so every section a step sends
is contiguous with the next: the step copies the one slice from its first section up to
`ids_offset` (+ its token ids). The block tables are sent only when they changed, and moved into place by the device
afterwards. Under async scheduling the token ids come from the previous step's sampled ids on the
device instead, gathered through the row sources when the rows moved.

The graphs' greedy tokens and logprobs go to the host without a copy: the sampling kernel writes
them into host memory the device maps (pinned, under unified addressing), at the row of a small
ring named by the out slot, as well as into the token ids above (the next step's inputs). The ring
has a row for each step that can be in flight, and one more that a step which will not be read
(its rows go through the Sampler instead) writes to. Off CUDA (the CPU tests) the ring is ordinary
host memory.

The int64 inputs (token ids, positions, slots) are pairs of int32 viewed as int64: the host writes
(value, 0), low word first, which is their little-endian encoding (every CUDA and ROCm host is
little-endian) for any value below 2**31.
"""

from __future__ import annotations

import sys

import torch

from hotpath.runner.seq_state import SeqState
from hotpath.layers.forward_batch import ForwardBatch

assert sys.byteorder == "little", "the int64 inputs are written as little-endian int32 pairs"


def _even(n: int) -> int:
    return n + (n & 1)


# ring rows for the sampled tokens of graph steps in flight: the engine has at most two launched
# and not collected (async scheduling); more is slack, and a step finding none free uses copies
OUT_SLOTS = 4


def _pairs(values: list[int]) -> list[int]:
    """int64 values (each < 2**31) as the int32 pairs of their little-endian encoding."""
    return [half for v in values for half in (v, 0)]


class DecodeInputs:
    def __init__(
        self, max_rows: int, max_blocks: int, scratch_block: int, block_size: int, device: torch.device,
        scratch_state_slot: int | None = None, query_len: int = 1,
    ) -> None:
        assert query_len == 1 or scratch_state_slot is None, "multi-token rows of a hybrid run eagerly"
        assert query_len <= block_size, "padding rows take their q tokens in the scratch block"
        self.query_len = q = query_len
        self.scratch_block = scratch_block
        self.block_size = block_size
        # hybrid models: the state slot no sequence owns, which padding rows read and write
        # (None: no state slots, the section is empty)
        self.scratch_state_slot = scratch_state_slot
        self._state_width = 0 if scratch_state_slot is None else 2  # int32 per row
        # fresh pinned host memory each step: torch's caching host allocator hands a pinned block
        # out again only after the copy that reads it has finished, so no step can overwrite the
        # inputs of one still in flight (a single reused pinned buffer would race)
        self.pin = device.type == "cuda"
        # the widest step: every section at max_rows, each padded to an even length
        self.ids_offset = (2 * max_rows + _even(max_rows * max_blocks) + 2 + _even(max_rows)
                           + 4 * q * max_rows + self._state_width * max_rows)
        self.buffer = torch.zeros(self.ids_offset + 2 * q * max_rows, dtype=torch.int32, device=device)
        # [max_rows * q] int64: the graphs' input token ids, and where they write their greedy tokens
        self.token_ids = self.buffer[self.ids_offset :].view(torch.int64)
        self.logprobs = torch.zeros(max_rows * q, dtype=torch.float32, device=device)  # greedy logprobs
        # [OUT_SLOTS + 1, max_rows] each, in host memory the graphs write (see the module doc);
        # the last row takes the tokens of steps nobody reads from here
        # (else they are copied: ROCm's pinned memory is device-accessible too, but untested there)
        self.mapped = torch.version.hip is None
        ring = dict(size=(OUT_SLOTS + 1, max_rows), pin_memory=self.pin)
        self.host_token_ids = torch.zeros(**ring, dtype=torch.int64)
        self.host_logprobs = torch.zeros(**ring, dtype=torch.float32)
        self._free_slots = list(range(OUT_SLOTS))
        # [max_rows, max_blocks]: rows are as wide as the longest context, so a step's block tables
        # ([n, w], w = its longest table) are sent compact and copied into place on the device
        self.block_tables = torch.full((max_rows, max_blocks), scratch_block, dtype=torch.int32, device=device)
        self.cu_query_lens = torch.arange(0, (max_rows + 1) * q, q, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_rows * q, dtype=torch.int64, device=device)
        self._sent_tables: list[list[int]] = []  # the block table rows as last sent

    # ---- the views a graph of `size` rows captures -------------------------------------------
    def _offsets(self, size: int) -> tuple[int, int, int, int]:
        """(context lens, positions, slots, state slots) offsets for a graph of `size` rows; the
        out slot is the two int32 before the context lens."""
        n = size * self.query_len  # tokens
        state_slots = self.ids_offset - self._state_width * size
        slots = state_slots - 2 * n
        positions = slots - 2 * n
        return positions - _even(size), positions, slots, state_slots

    def views(self, size: int, max_context_len: int) -> tuple[torch.Tensor, torch.Tensor, ForwardBatch]:
        """(token ids, positions, batch) of a graph of `size` rows."""
        ctx, pos, slots, state = self._offsets(size)
        n = size * self.query_len
        state_slots = None
        if self.scratch_state_slot is not None:
            state_slots = self.buffer[state : state + 2 * size].view(torch.int64)
        batch = ForwardBatch(
            cu_query_lens=self.cu_query_lens[: size + 1],
            context_lens=self.buffer[ctx : ctx + size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.buffer[slots : slots + 2 * n].view(torch.int64),
            logits_indices=self.logits_indices[:n],
            max_query_len=self.query_len,
            max_context_len=max_context_len,
            state_slots=state_slots,  # no state_saves: the runner saves a decode step's snapshots after it
        )
        return self.token_ids[:n], self.buffer[pos : pos + 2 * n].view(torch.int64), batch

    def host_out(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a graph of `size` rows writes its greedy tokens to on the host: (out slot [1]
        int32 on the device, token ids [OUT_SLOTS + 1, size], logprobs [OUT_SLOTS + 1, size])."""
        assert self.query_len == 1
        ctx = self._offsets(size)[0]
        return self.buffer[ctx - 2 : ctx - 1], self.host_token_ids[:, :size], self.host_logprobs[:, :size]

    def take_slot(self) -> int | None:
        """A free ring row for a step whose tokens will be read from it, or None (none free)."""
        return self._free_slots.pop() if self._free_slots else None

    def release_slot(self, slot: int) -> None:
        """Gives back a ring row once its step's tokens were read."""
        assert slot not in self._free_slots and 0 <= slot < OUT_SLOTS
        self._free_slots.append(slot)

    # ---- one step --------------------------------------------------------------------------
    def fill(
        self,
        seqs: list[SeqState],
        size: int,
        prev: tuple[torch.Tensor, list[int]] | None = None,
        slot: int | None = None,
        rows: list[tuple[int, list[int]]] | None = None,
    ) -> None:
        """Writes a decode step's inputs for a graph of `size` rows: row i decodes seqs[i] (the
        token at its position num_computed_tokens); rows past len(seqs) are padding that attends
        to q tokens of the scratch block and writes its K/V there (and, in a hybrid model, starts
        the scratch state slot from zero states, a first token's context of 1). The graph writes its greedy
        tokens to ring row `slot` on the host (None: to the row nobody reads). `rows` gives each
        sequence's (first position, tokens) instead: up to q tokens (padded to q), or with `prev`
        one token whose id comes from there.

        With `prev` = (sampled ids on the device, source rows), row i's token is sampled_ids[
        source_rows[i]] instead of one from the host (async scheduling: the host has not seen it
        yet). A graph writes its greedy tokens over its input ids, so after a graph step whose
        rows stay in place the ids are where they belong already."""
        n = len(seqs)
        gather = prev is not None and not (
            prev[0].data_ptr() == self.token_ids.data_ptr() and prev[1] == list(range(n))
        )
        head = _pairs(prev[1]) if gather else []  # the sections before the context lengths
        tables_at = len(head)
        tables, width = self._changed_tables(seqs, size)
        head += tables
        tail = [OUT_SLOTS if slot is None else slot, 0] + self._row_inputs(seqs, size, prev is None, rows)
        end = self.ids_offset + (2 * size * self.query_len if prev is None else 0)
        start = end - len(head) - len(tail)
        host = torch.tensor(head + tail, dtype=torch.int32, pin_memory=self.pin)
        self.buffer[start:end].copy_(host, non_blocking=True)
        if tables:
            at = start + tables_at
            self.block_tables[:size, :width].copy_(self.buffer[at : at + size * width].view(size, width))
        if gather:
            sources = self.buffer[start : start + 2 * n].view(torch.int64)
            # through a temporary: the source may be these very ids, in another order
            self.token_ids[:n].copy_(prev[0].index_select(0, sources))

    def _changed_tables(self, seqs: list[SeqState], size: int) -> tuple[list[int], int]:
        """The step's block tables as `size` rows of one width (padded to an even length), and that
        width; ([], 0) when the device holds them already."""
        # padding rows get a table of the scratch block alone
        tables = [seq.block_table for seq in seqs] + [[self.scratch_block]] * (size - len(seqs))
        if tables == self._sent_tables[:size]:
            return [], 0
        self._sent_tables = [list(t) for t in tables]
        width = max(len(t) for t in tables)
        flat = [b for t in tables for b in t + [self.scratch_block] * (width - len(t))]
        return flat + [0] * (len(flat) & 1), width

    def _row_inputs(self, seqs: list[SeqState], size: int, with_ids: bool,
                    rows: list[tuple[int, list[int]]] | None) -> list[int]:
        """Context lengths, positions, slots, state slots (and token ids) of `size` rows of q
        tokens, laid out as a graph of that size reads them."""
        bs, q = self.block_size, self.query_len
        pad = size - len(seqs)
        if rows is None:
            rows = [(seq.num_computed_tokens, [seq.token_at(seq.num_computed_tokens)] if with_ids else [])
                    for seq in seqs]
        firsts = [first for first, _ in rows]
        ctx = [p + q for p in firsts] + [q] * pad + [0] * (size & 1)
        # an image-text model's sequence rotates its tokens past its images at index + rope_delta
        positions = [p + seq.rope_delta for seq, first in zip(seqs, firsts) for p in range(first, first + q)]
        positions += list(range(q)) * pad
        slots = [seq.block_table[p // bs] * bs + p % bs for seq, first in zip(seqs, firsts)
                 for p in range(first, first + q)]
        slots += [self.scratch_block * bs + j for j in range(q)] * pad
        out = ctx + _pairs(positions) + _pairs(slots)
        if self.scratch_state_slot is not None:
            out += _pairs([seq.state_slot for seq in seqs] + [self.scratch_state_slot] * pad)
        if with_ids:
            out += _pairs([t for _, tokens in rows for t in tokens + tokens[-1:] * (q - len(tokens))]
                          + [0] * (q * pad))
        return out
