"""Hybrid models' state around a step: prefix-cache snapshots restored into slots and saved from
them, and a verify step's linear-attention state rolled back to the tokens it kept."""

from __future__ import annotations

import torch

from hotpath.runner.seq_state import SeqState


class HybridState:
    """ModelRunner's linear-attention state bookkeeping: reads its state layers and device."""

    @torch.inference_mode()
    def rollback_states(self, rows: list[tuple[SeqState, int]]) -> None:
        """After a verify step's acceptance (hybrid models): each (sequence, tokens it kept of
        its row: accepted drafts + 1) of the step's verify rows. Its linear-attention layers'
        state slot is set back to the state after those tokens (GatedDeltaNet.rollback); a row
        that kept every token is left as it is. Queued on the device, no host sync. Called after
        the step's collect and before the next launch, which frees the step's records anyway (the
        rows that finished are not rolled back: their slots are free)."""
        picks = []
        for seq, kept in rows:
            j, num_tokens = self._verify_rows[seq.seq_id]
            assert 1 <= kept <= num_tokens, (kept, num_tokens)
            if kept < num_tokens:
                picks.append((j, kept))
        if picks:
            verify, kept = map(list, zip(*picks))
            for layer in self.state_layers:
                layer.rollback(verify, kept)
        self._free_verify_records()

    def _free_verify_records(self) -> None:
        for layer in self.state_layers:
            layer.verify = None
        self._verify_rows = {}

    def _state_saves(self, scheduled: list[tuple[SeqState, int]]) -> list[tuple[int, int, int]] | None:
        """Hybrid models: first the snapshots the step's sequences start from (a prefix hit) are
        copied into their slots; returns where the step saves snapshots, (row, tokens into the
        row's chunk, snapshot id), for the layers to save as they go. A decode step's saves are
        the runner's, after the forward (_save_decoded_snapshots), graph or not.

        A verify row saves where planned too, `cut` tokens into its last token and drafts. Kept
        tokens reach the cut: the state is the sequence's. They stop short of it: the pending
        snapshot holds a state with rejected drafts, labelled with a boundary past the sequence's
        computed tokens; it is never registered (registration needs the boundary block's hash, and
        blocks are hashed only up to computed tokens whose ids are known), and the step that
        brings the sequence to that boundary saves it again. (Not saving in verify rows would be
        wrong: plan_save has already moved the pending snapshot's boundary on, so an accepted run
        over it would leave the old state registered under the new boundary.)"""
        if not self.state_layers:
            return None
        self._restore_snapshots(scheduled)
        if all(n == 1 for _, n in scheduled):
            return None
        saves = [(row, *seq.save_at) for row, (seq, _) in enumerate(scheduled) if seq.save_at is not None]
        for seq, _ in scheduled:
            seq.save_at = None
        return saves

    def _restore_snapshots(self, scheduled: list[tuple[SeqState, int]]) -> None:
        """Copies the snapshots the step's sequences start from (a prefix hit) into their slots."""
        restores = [(seq.state_slot, seq.restore_snapshot) for seq, _ in scheduled
                    if seq.restore_snapshot is not None]
        if restores:
            slots, snaps = (torch.tensor(x, device=self.device) for x in zip(*restores))
            for layer in self.state_layers:
                layer.restore(snaps, slots)
            for seq, _ in scheduled:
                seq.restore_snapshot = None

    def _save_decoded_snapshots(self, scheduled: list[tuple[SeqState, int]]) -> None:
        """A decode step's snapshot saves, queued behind its forward (a graph's replay or an
        eager one): each sequence's state after its one token (the only place a decode step
        saves)."""
        saves = [(seq.state_slot, *seq.save_at) for seq, _ in scheduled if seq.save_at is not None]
        if not saves:
            return
        slots, cuts, snaps = zip(*saves)
        assert set(cuts) == {1}, "a decode step saves after its token"
        slots, snaps = torch.tensor(slots, device=self.device), torch.tensor(snaps, device=self.device)
        for layer in self.state_layers:
            layer.save(slots, snaps)
        for seq, _ in scheduled:
            seq.save_at = None
