"""A step's positions and ForwardBatch built by hand over fixed block tables, for the parallel
model tests."""

from __future__ import annotations

import torch

from hotpath.layers.forward_batch import ForwardBatch


def paged_step(rows: list[tuple[int, int]], tables: list[list[int]], block: int,
               state_slots: tuple[int, ...] | None = None) -> tuple[torch.Tensor, ForwardBatch]:
    """Positions and batch of a step in which sequence i brings rows[i] = (start, n) tokens over
    block table tables[i] (and, for a hybrid model, state slot state_slots[i])."""
    cu, slots, positions = [0], [], []
    for (start, n), table in zip(rows, tables):
        cu.append(cu[-1] + n)
        for p in range(start, start + n):
            positions.append(p)
            slots.append(table[p // block] * block + p % block)
    i32 = torch.int32
    batch = ForwardBatch(
        cu_query_lens=torch.tensor(cu, dtype=i32),
        context_lens=torch.tensor([s + n for s, n in rows], dtype=i32),
        block_tables=torch.tensor(tables, dtype=i32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        logits_indices=torch.tensor([c - 1 for c in cu[1:]], dtype=torch.int64),
        max_query_len=max(n for _, n in rows), max_context_len=max(s + n for s, n in rows),
        state_slots=None if state_slots is None else torch.tensor(state_slots, dtype=torch.int64),
        cu_query_lens_host=cu,
    )
    return torch.tensor(positions, dtype=torch.int64), batch
