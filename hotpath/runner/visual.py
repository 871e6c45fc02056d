"""A step's visual tokens (image-text models): the vision tower's outputs for them, from the encoder
cache or from one tower run over every image of the step that misses it, and their mRoPE rows."""

from __future__ import annotations

import torch

from hotpath.layers.forward_batch import VisualEmbeds
from hotpath.multimodal.encoder_cache import EncoderCache, EncoderOutput
from hotpath.multimodal.inputs import MultiModalItem, normalise_pixels
from hotpath.runner.seq_state import SeqState


class VisualInputs:
    """ModelRunner's visual tokens: reads its model, device, dtype and `encoder_cache`."""

    def _encoder_outputs(self, items: list[MultiModalItem]) -> dict[str, EncoderOutput]:
        """Each item's tower output by content hash: cached ones as they are, the rest from one
        tower run over all of them (the GEMMs batched over every patch)."""
        cache: EncoderCache = self.encoder_cache
        found: dict[str, EncoderOutput] = {}
        missing: dict[str, MultiModalItem] = {}
        for item in items:
            h = item.content_hash
            if h in found or h in missing:
                continue
            out = cache.get(h)
            if out is None:
                missing[h] = item
            else:
                found[h] = out
        if missing:
            todo = list(missing.values())
            pixels = normalise_pixels(todo, self.device, self.dtype)
            embeds, deepstack = self.model.visual(pixels, [item.grid_thw for item in todo])
            sizes = [item.num_tokens for item in todo]
            # each item's rows a tensor of its own, so an evicted one frees its memory
            own = (lambda x: x.clone()) if len(todo) > 1 else (lambda x: x)
            parts = [embeds.split(sizes)] + [level.split(sizes) for level in deepstack]
            for item, *rows in zip(todo, *parts):
                out = (own(rows[0]), [own(level) for level in rows[1:]])
                cache.put(item.content_hash, out)
                found[item.content_hash] = out
        return found

    def _visual_embeds(self, rows: list[tuple[SeqState, int, int, int]]) -> VisualEmbeds:
        """rows: (sequence, its first token in the step, the token after its last, its first row
        in the flat batch) of the rows holding visual tokens; their embeddings, by flat row."""
        items = [item for seq, start, end, _ in rows for item in seq.mm_items
                 if any(off < end and start < off + n for off, n in item.spans)]
        outputs = self._encoder_outputs(items)
        flat: list[int] = []
        parts: list[torch.Tensor] = []
        levels: list[list[torch.Tensor]] = []
        for seq, start, end, base in rows:
            for item in seq.mm_items:
                embeds, deepstack = outputs.get(item.content_hash, (None, []))
                k = 0  # the item's embedding row of the span's first token
                for off, n in item.spans:
                    a, b = max(start, off), min(end, off + n)
                    if a < b:
                        flat.extend(range(base + a - start, base + b - start))
                        parts.append(embeds[k + a - off : k + b - off])
                        levels.append([level[k + a - off : k + b - off] for level in deepstack])
                    k += n
        rows_t = torch.tensor(flat, dtype=torch.int64).to(self.device, non_blocking=True)
        deepstack = [torch.cat(level) for level in zip(*levels)]
        return VisualEmbeds(rows_t, torch.cat(parts), deepstack)
