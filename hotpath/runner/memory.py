"""The memory budget: how many KV blocks and linear-attention state slots fit beside the weights
and a step's activations, and the cache tensors allocated from the layers' declarations."""

from __future__ import annotations

import logging

import torch

from hotpath.models.vision import VisionConfig
from hotpath.runner.plan import SPEC_GRAPH_MAX_ROWS

logger = logging.getLogger(__name__)


def state_slots_that_fit(max_num_seqs: int, bytes_per_slot: int, snapshots: bool, budget: float) -> int:
    """Hybrid models' state slots: one per sequence up to max_num_seqs, as many snapshots again
    with prefix caching, and a scratch slot, in at most half of `budget` bytes (the rest is for
    the KV blocks)."""
    copies = 2 if snapshots else 1
    slots = min(max_num_seqs, int(budget / 2 / bytes_per_slot - 1) // copies)
    if slots < 1:
        raise ValueError(
            f"no memory left for even one sequence's linear-attention state ({bytes_per_slot / 2**20:.0f} MB) "
            "after loading the model; raise gpu_memory_utilization or lower max_num_batched_tokens"
        )
    return slots


class MemoryBudget:
    """ModelRunner's caches: reads its configs, device, dtype and cache layers (runner/model_runner.py)."""

    def _cache_bytes_per_block(self) -> int:
        """Every attention layer's K/V bytes for block_size tokens, from the layers' declarations."""
        return sum(layer.cache_spec().bytes_per_token(self.kv_cache_dtype)
                   for layer in self.kv_layers) * self.block_size

    def _num_state_slots(self) -> int:
        ec = self.engine_config
        if self.device.type != "cuda":
            return ec.max_num_seqs
        per_slot = sum(layer.cache_spec().bytes_per_slot(self.dtype) for layer in self.state_layers)
        per_slot += 2 * sum(layer.cache_spec().bytes_per_slot(self.dtype) for layer in self.draft_state_layers)
        free, total = torch.cuda.mem_get_info(self.device)
        budget = total * ec.gpu_memory_utilization - (total - free) - self._activation_bytes()
        slots = state_slots_that_fit(ec.max_num_seqs, per_slot, ec.enable_prefix_caching, budget)
        if slots < ec.max_num_seqs:
            logger.info("state slots for %d sequences at once, not max_num_seqs=%d: each sequence's "
                        "linear-attention state takes %.0f MB (twice that with its prefix-cache "
                        "snapshot), and the states may take half the memory left for caches",
                        slots, ec.max_num_seqs, per_slot / 2**20)
        return slots

    def _num_kv_blocks(self) -> int:
        ec = self.engine_config
        if ec.num_gpu_blocks_override is not None:
            return ec.num_gpu_blocks_override
        per_block = self._cache_bytes_per_block()
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = total * ec.gpu_memory_utilization - used - self._activation_bytes()
        else:
            # the CPU has no fixed pool; take what the longest batch could use, capped
            wanted = ec.max_num_seqs * ec.max_model_len * per_block // self.block_size
            budget = min(ec.cpu_kv_cache_gib * 2**30, wanted)
        num_blocks = int(budget // per_block)
        if num_blocks < 1:
            raise ValueError(
                "no memory left for the KV cache after loading the model; "
                "raise gpu_memory_utilization or lower max_num_batched_tokens"
            )
        return num_blocks

    def _activation_bytes(self) -> int:
        """Peak memory of one step beyond weights and cache: a few [tokens, hidden] activations
        and a layer's widest intermediates for the largest token batch, plus fp32 logits and
        sampler work space."""
        cfg, ec = self.model_config, self.engine_config
        per_token = (4 * cfg.hidden_size + cfg.activation_width()) * self.dtype.itemsize
        logits = ec.max_num_seqs * cfg.vocab_size * 4 * 4
        spec = 0
        if self.num_speculative_tokens:
            rows = min(ec.max_num_seqs, SPEC_GRAPH_MAX_ROWS)
            tokens = rows * (1 + self.num_speculative_tokens)
            # the verify graphs' logits buffer and one graph's logits in the pool
            spec = 2 * tokens * cfg.vocab_size * 4
            for layer in self.state_layers:  # a hybrid's verify rows: states before the step, inputs
                s = layer.cache_spec()
                spec += rows * s.bytes_per_slot(self.dtype) + tokens * (2 * s.conv_dim * self.dtype.itemsize
                                                                        + 2 * s.num_v_heads * 4)
        step = ec.max_num_batched_tokens * per_token
        encoder_cache = 0
        if cfg.multimodal is not None:
            # the vision tower runs before the language model in a step, on up to a step's
            # visual tokens (4 patches each); its outputs stay in the encoder cache
            v = VisionConfig.from_hf(cfg.multimodal.vision_config)
            patches = ec.max_num_batched_tokens * v.spatial_merge_size**2
            step = max(step, patches * (6 * v.hidden_size + 2 * v.intermediate_size) * self.dtype.itemsize)
            encoder_cache = (self.encoder_cache.capacity * v.out_hidden_size
                             * (1 + len(v.deepstack_visual_indexes)) * self.dtype.itemsize)
        return step + encoder_cache + logits + spec + 512 * 2**20

    def _allocate_kv_cache(self) -> None:
        # one block more than the manager hands out: padding rows of a CUDA graph batch write there
        self.scratch_block = self.num_blocks
        for layer in self.kv_layers:
            layer.bind_cache(layer.cache_spec().allocate(self.num_blocks + 1, self.block_size,
                                                         self.kv_cache_dtype, self.device))
