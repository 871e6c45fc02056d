"""The encoder cache: the vision tower's outputs by image content hash, shared across requests.

A prefill that cuts through an image, a preempted sequence coming back, and another request with
the same image all take the tower's output from here instead of running it again. It holds at
most `capacity` visual tokens (counted in the runner's memory budget), evicting the least
recently used; an entry larger than the whole cache is still kept, alone, until the next one
comes, so a prefill chunked through one huge image runs the tower once.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

# (embeddings [tokens, hidden], DeepStack features, each [tokens, hidden])
EncoderOutput = tuple[torch.Tensor, list[torch.Tensor]]


class EncoderCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # visual tokens
        self._entries: OrderedDict[str, EncoderOutput] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.misses = 0

    def get(self, content_hash: str) -> EncoderOutput | None:
        out = self._entries.get(content_hash)
        if out is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(content_hash)
        return out

    def put(self, content_hash: str, out: EncoderOutput) -> None:
        if content_hash in self._entries:
            return
        tokens = out[0].shape[0]
        while self._entries and self._tokens + tokens > self.capacity:
            _, old = self._entries.popitem(last=False)
            self._tokens -= old[0].shape[0]
        self._entries[content_hash] = out
        self._tokens += tokens

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)
