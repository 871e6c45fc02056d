"""The KV cache manager: a pool of fixed-size blocks with reference counts and a prefix cache.

Each attention layer's cache is [num_blocks, block_size, num_kv_heads, head_dim] (see
ops/attention/reference.py); this module decides which blocks a sequence owns, never touches tensors.

Prefix caching: once a block is full of computed tokens it is registered under a hash of its tokens
chained to the previous block's hash, so equal prefixes map to equal hash chains. A new sequence
reuses the longest chain of registered blocks that matches its tokens (verified token by token, so a
hash collision cannot produce wrong output). Freed registered blocks stay cached until the space is
needed, then are evicted least-recently-used first.

Hybrid (linear-attention) models will add a pool of fixed-size per-sequence state slots beside the
block pool; the scheduler already allocates through this one manager, so that is where it goes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from hotpath.engine.sequence import Sequence
from hotpath.engine.state_snapshots import StateSnapshots


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set while the block is registered in the prefix cache
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


def _chain_hash(parent_hash: int | None, token_ids: tuple[int | str, ...]) -> int:
    return hash((parent_hash, token_ids))


def block_key(seq: Sequence, tokens: list[int], i: int, block_size: int) -> tuple[int | str, ...]:
    """What identifies block i of seq's tokens: its token ids and, where it holds image or video
    placeholders, those items' content hashes (the same placeholders stand for any image)."""
    lo, hi = i * block_size, (i + 1) * block_size
    key = tuple(tokens[lo:hi])
    if seq.mm_items:
        key += tuple(item.content_hash for item in seq.mm_items
                     if any(off < hi and lo < off + n for off, n in item.spans))
    return key


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 num_state_slots: int = 0, snapshots: StateSnapshots | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))  # hold no cached content
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced but cached, LRU first
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0
        # a slot of linear-attention state per running sequence (hybrid models; 0: none needed)
        self.free_state_slots: deque[int] = deque(range(num_state_slots))
        self.needs_state_slots = num_state_slots > 0
        self.snapshots = snapshots  # hybrid models' prefix caching

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of seq's tokens (full blocks only).

        At least one token is always left to compute, since sampling needs its logits."""
        if not self.enable_prefix_caching:
            return []
        tokens = seq.all_token_ids
        bs = self.block_size
        hits: list[int] = []
        parent: int | None = None
        for i in range((len(tokens) - 1) // bs):
            chunk = block_key(seq, tokens, i, bs)
            h = _chain_hash(parent, chunk)
            block_id = self.cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != chunk or block.parent_hash != parent:
                break
            hits.append(block_id)
            parent = h
        if self.snapshots is not None:  # only as far as a snapshot of the state reaches
            usable = self.snapshots.lookup([self.blocks[b].block_hash for b in hits])
            hits = hits[:usable]
            seq.restore_snapshot = (self.snapshots.restore_id(self.blocks[hits[-1]].block_hash)
                                    if hits else None)
        self.prefix_queried_tokens += len(tokens)
        self.prefix_hit_tokens += len(hits) * bs
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """Give seq the cached prefix blocks (if any) and enough fresh blocks for num_new_tokens
        more tokens. Returns False, changing nothing, when the pool is too small."""
        bs = self.block_size
        num_computed = seq.num_computed_tokens + len(cached_blocks) * bs
        blocks_needed = -(-(num_computed + num_new_tokens) // bs)
        num_fresh = blocks_needed - len(seq.block_table) - len(cached_blocks)
        # reusing an unreferenced cached block takes it out of the free pool too
        num_revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if max(num_fresh, 0) + num_revived > self.num_free_blocks:
            return False
        if self.needs_state_slots and seq.state_slot is None:
            if not self.free_state_slots:
                return False
            seq.state_slot = self.free_state_slots.popleft()
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.evictable[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.block_hash)
            assert block.parent_hash == parent
            parent = block.block_hash
        seq.num_computed_tokens = num_computed
        for _ in range(num_fresh):
            seq.block_table.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.popleft()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                if self.snapshots is not None:
                    self.snapshots.forget_block(block.block_hash)
            block.block_hash, block.parent_hash, block.token_ids = None, None, ()
        self.blocks[block_id].ref_count = 1
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that have become full of computed tokens whose ids the host has
        (under async scheduling a computed token's id may still be on the device)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        tokens = None
        for i in range(len(seq.block_hashes), min(seq.num_computed_tokens, seq.num_known_tokens) // bs):
            if tokens is None:
                tokens = seq.all_token_ids
            chunk = block_key(seq, tokens, i, bs)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = _chain_hash(parent, chunk)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and h not in self.cached:
                block.block_hash, block.parent_hash, block.token_ids = h, parent, chunk
                self.cached[h] = block.block_id

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Frees seq's blocks past those that hold `num_tokens` tokens (a verify step's rejected
        drafts had blocks of their own). Freed tail blocks were never registered: a block is
        registered only once full of tokens on the host."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            block = self.blocks[seq.block_table.pop()]
            seq.num_blocks_sent = min(seq.num_blocks_sent, len(seq.block_table))
            assert block.ref_count == 1 and block.block_hash is None
            block.ref_count = 0
            self.free_ids.append(block.block_id)

    def free(self, seq: Sequence) -> None:
        if self.snapshots is not None:
            self.snapshots.release(seq)  # needs the block hashes, cleared below
        seq.restore_snapshot = seq.save_at = None
        # tail blocks first, so they are evicted before the prefix blocks others may share
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                if block.block_hash is not None:
                    self.evictable[block_id] = None
                else:
                    self.free_ids.append(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.on_workers = False  # the workers forget it; its next step sends it again
        seq.num_computed_tokens = seq.num_draft_computed = 0
        if seq.state_slot is not None:  # a preempted sequence starts its state again
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = None
