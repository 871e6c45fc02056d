"""ModelRunner: turns a scheduled step into batch tensors, runs the model, samples.

It owns the model, the KV cache tensors and the sampler. The engine hands it
(sequence, num_new_tokens) pairs and gets back one sampled token per sequence whose tokens are
all computed after this step (a prefill's last chunk, or a decode), in two halves: `launch`
queues the step on the device and returns at once, `collect` waits for its tokens. Between the two
the engine may schedule and launch the next decode step, its input tokens read from this step's
sampled ids on the device (async scheduling).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from hotpath.config import EngineConfig, ModelConfig
from hotpath.layers.cache import KVCacheSpec, StateCacheSpec
from hotpath.loader.model_loader import load_model, load_mtp
from hotpath.models.decoder import rotary_table
from hotpath.multimodal.encoder_cache import EncoderCache
from hotpath.ops.backend import use_triton
from hotpath.ops.bitmask import apply_token_bitmask
from hotpath.ops.quant import fp8_dtype
from hotpath.runner.batch import BatchBuilding
from hotpath.runner.graphs import Capture, DecodeGraphs, Replayable
from hotpath.runner.hybrid_state import HybridState
from hotpath.runner.memory import MemoryBudget
from hotpath.runner.plan import SampledToken
from hotpath.runner.row_graphs import RowGraphs
from hotpath.runner.sampler import Sampler
from hotpath.runner.seq_state import SeqState, is_plain_greedy
from hotpath.runner.step_types import LaunchedStep
from hotpath.runner.verify import Verify
from hotpath.runner.visual import VisualInputs
from hotpath.structured.bitmask import TokenMask

logger = logging.getLogger(__name__)


class ModelRunner(MemoryBudget, BatchBuilding, VisualInputs, HybridState, Verify, DecodeGraphs):
    """One rank's model and caches; each job in a room of its own (memory.py, batch.py,
    visual.py, hybrid_state.py, verify.py, graphs.py), the step's launch and collect here."""

    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        model_dir: Path,
        load_format: str,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
        enforce_eager: bool = False,
        draft: tuple[ModelConfig, Path] | None = None,
        num_speculative_tokens: int = 0,
        mtp: bool = False,
    ) -> None:
        self.model_config = model_config
        self.engine_config = engine_config
        self.device = device
        self.dtype = dtype
        self.model = load_model(
            model_config, model_dir, load_format, device, dtype, engine_config.max_model_len, seed
        )
        # speculative decoding's draft model: its K/V blocks are the target's block ids in
        # tensors of its own, sized and allocated with the target's (speculative/model_drafters.py)
        self.draft_model = None if draft is None else load_model(
            draft[0], draft[1], load_format, device, dtype, engine_config.max_model_len, seed + 1)
        # speculative decoding's multi-token-prediction head (models/mtp.py): the checkpoint's
        # mtp.* layer on the target's embedding and LM head, its K/V beside the target's
        self.mtp = None if not mtp else load_mtp(
            model_config, model_dir, load_format, device, dtype, engine_config.max_model_len, seed + 1, self.model)
        self.num_speculative_tokens = num_speculative_tokens  # K: verify graphs take rows of 1 + K
        # image-text models: the tower's outputs by image, and the RoPE table whose rows past
        # mrope_row0 a step's visual tokens rotate with (layers/rotary.py)
        self.encoder_cache = EncoderCache(engine_config.max_num_batched_tokens)
        self.mrope_table = rotary_table(self.model) if model_config.multimodal is not None else None
        self.mrope_row0 = 0 if self.mrope_table is None else self.mrope_table.max_positions
        self.block_size = engine_config.block_size
        # K and V in the model dtype, or in fp8 (half bf16's bytes a token: twice the blocks fit)
        self.kv_cache_dtype = fp8_dtype(device) if engine_config.kv_cache_dtype == "fp8" else dtype
        layers = self.model.cache_layers()
        for extra in (self.draft_model, self.mtp):
            if extra is not None:
                layers = layers + extra.cache_layers()
        self.kv_layers = [layer for layer in layers if isinstance(layer.cache_spec(), KVCacheSpec)]
        # the target's linear-attention layers (hybrid models), and a hybrid draft model's
        self.state_layers = [layer for layer in self.model.cache_layers()
                             if isinstance(layer.cache_spec(), StateCacheSpec)]
        self.draft_state_layers = [] if self.draft_model is None else [
            layer for layer in self.draft_model.cache_layers() if isinstance(layer.cache_spec(), StateCacheSpec)]
        # a state slot per sequence the scheduler may run at once, each freed when its sequence
        # finishes or is preempted (hybrid models; none otherwise); fewer where max_num_seqs
        # slots would not fit (a waiting request then waits for a slot)
        stateful = bool(self.state_layers or self.draft_state_layers)
        self.num_state_slots = self._num_state_slots() if stateful else 0
        # and as many snapshots of it, for prefix caching (engine/state_snapshots.py)
        self.num_snapshots = self.num_state_slots if engine_config.enable_prefix_caching and self.state_layers else 0
        # one slot more than the manager hands out: padding rows of a CUDA graph batch use it
        # (allocated before the KV blocks are sized, so it counts against the memory budget too)
        self.scratch_state_slot = self.num_state_slots if self.state_layers else None
        for layer in self.state_layers:
            spec = layer.cache_spec()
            layer.bind_cache(spec.allocate(self.num_state_slots + 1, dtype, device),
                             spec.allocate(self.num_snapshots, dtype, device))
        # a hybrid draft model: each sequence's slot, and a second one its speculative tokens run
        # on (a copy of the first, made at its first draft: rows_batch), so the drafts it feeds
        # itself never advance the state its next catch-up continues from; no snapshots (the
        # draft model starts each sequence from its first token)
        for layer in self.draft_state_layers:
            spec = layer.cache_spec()
            layer.bind_cache(spec.allocate(2 * self.num_state_slots + 1, dtype, device),
                             spec.allocate(0, dtype, device))
        # the last verify step's rows, for rollback_states: seq_id -> (index among the step's
        # verify rows, the row's tokens)
        self._verify_rows: dict[int, tuple[int, int]] = {}
        self.num_blocks = self._num_kv_blocks()
        self._allocate_kv_cache()
        self.sampler = Sampler()
        self.graphs: dict[int, tuple[Replayable, torch.Tensor]] = {}  # batch size -> (graph, logits)
        # batch size -> [(longest context, graph, logits)], ascending: graphs for short contexts
        self.short_graphs: dict[int, list[tuple[int, Replayable, torch.Tensor]]] = {}
        # speculative steps' graphs, captured with the decode graphs: (draft model?, q) -> RowGraphs
        self.row_graphs: dict[tuple[bool, int], RowGraphs] = {}
        self._capture: Capture | None = None  # how graphs are recorded; None: every step eager
        # the reference ops read lengths on the host, which a graph capture cannot hold (hybrids
        # too: their decode steps run the linear-attention layers' Triton kernels, no host sync)
        if device.type == "cuda" and not enforce_eager and use_triton(torch.empty(0, device=device)):
            self._capture_decode_graphs()

    @torch.inference_mode()
    def launch(self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None = None,
               mask_follows: bool = False) -> LaunchedStep:
        """Queues one step on the device: the forward, the sampling, and the copy of the sampled
        tokens to the host; returns without waiting for any of it (`collect` waits).

        `prev` is the step launched just before and not collected yet (async scheduling): a row
        whose input token is a pending token of prev's takes it from prev's sampled ids on the
        device. Such rows must be plain greedy (is_plain_greedy), or the step must wait for its
        mask: the Sampler would read output token lists that lack the pending tokens.

        `mask_follows` (structured output): the step stops at its logits and samples when
        `sample` brings its token mask, which the engine fills while the forward runs."""
        if self._verify_rows:  # the last verify step's records, rolled back by now (or finished)
            self._free_verify_records()
        if any(seq.draft_token_ids for seq, _ in scheduled) and (
                verify := self._verify_in_graph(scheduled, mask_follows)):
            return verify
        self._hidden = (None, None)
        step = self._launch(scheduled, prev, mask_follows)
        # with an MTP head: its inputs, once the step's tokens are on the host (else None)
        (step.hidden, step.hidden_rows), self._hidden = self._hidden, (None, None)
        return step

    def _launch(self, scheduled: list[tuple[SeqState, int]], prev: LaunchedStep | None,
                mask_follows: bool) -> LaunchedStep:
        graph_size = self._graph_size(scheduled)
        if graph_size:
            sampling = [seq for seq, _ in scheduled]
            inputs = self.decode_inputs
            plain = all(is_plain_greedy(seq) for seq in sampling)  # the graph samples them
            slot = inputs.take_slot() if plain and inputs.mapped else None
            if self.state_layers:  # a hybrid's state snapshots: restored before the replay, saved after
                self._restore_snapshots(scheduled)
            logits = self._run_decode_graph(scheduled, graph_size, prev, slot)
            if self.state_layers:
                self._save_decoded_snapshots(scheduled)
            if plain:
                n = len(sampling)
                return self._launched(scheduled, sampling, inputs.token_ids[:n], inputs.logprobs[:n],
                                      out_slot=slot)
        else:
            input_ids, positions, batch, sampling, placed = self._prepare(scheduled, prev)
            hidden = self.model(input_ids, positions, batch)
            if self.mtp is not None:  # (kept only for it: a prefill's activations otherwise)
                self._hidden = (hidden, placed)
            if self.state_layers and batch.max_query_len == 1:
                self._save_decoded_snapshots(scheduled)
            if not sampling:
                return LaunchedStep(scheduled, [], None, [], None)
            logits = self.model.compute_logits(hidden[batch.logits_indices])  # [num_logits, vocab]
        step = LaunchedStep(scheduled, sampling, None, [], None, logits=logits,
                            verifies=any(seq.draft_token_ids for seq in sampling))
        return step if mask_follows else self._sample(step)

    @torch.inference_mode()
    def sample(self, step: LaunchedStep, mask: TokenMask) -> LaunchedStep:
        """Samples a step launched with `mask_follows`: its token mask applied to the logits of
        the constrained rows (-inf where a token is refused), then the sampling (or verification)
        the step would have done, queued behind its forward. Returns the step to collect."""
        first, row = {}, 0  # each sampling sequence's first logits row
        for seq in step.sampling:
            first[seq.seq_id] = row
            row += 1 + len(seq.draft_token_ids)
        rows = torch.tensor([first[seq_id] for seq_id in mask.seq_ids], dtype=torch.int64)  # [masked]
        on_cuda = self.device.type == "cuda"
        apply_token_bitmask(step.logits, mask.bitmask.to(self.device, non_blocking=on_cuda),
                            (rows.pin_memory() if on_cuda else rows).to(self.device, non_blocking=on_cuda))
        sampled = self._sample(step)
        sampled.hidden, sampled.hidden_rows = step.hidden, step.hidden_rows
        return sampled

    def _sample(self, step: LaunchedStep) -> LaunchedStep:
        """A step's tokens from its sampling rows' logits: verified drafts, or the Sampler's."""
        scheduled, sampling, logits = step.scheduled, step.sampling, step.logits
        if step.verifies:
            return self._verify(scheduled, sampling, logits)
        out = self.sampler(
            logits,
            [s.params for s in sampling],
            [s.prompt_token_ids for s in sampling],
            [s.output_token_ids for s in sampling],
            [s.generator for s in sampling],
            # stop and EOS ids are held back until min_tokens; most requests set none, and a plain
            # greedy row has none in force (its output list may lack pending tokens)
            [list(s.stop_token_ids) if s.params.min_tokens and not is_plain_greedy(s) else []
             for s in sampling],
        )
        return self._launched(
            scheduled, sampling, out.token_ids, out.logprobs, out.top_logprob_ids, out.top_logprobs
        )

    def _launched(
        self,
        scheduled: list[tuple[SeqState, int]],
        sampling: list[SeqState],
        token_ids: torch.Tensor,  # [num_sampled] int64
        logprobs: torch.Tensor,  # [num_sampled] float32
        top_ids: torch.Tensor | None = None,  # [num_sampled, k] int64
        top_logprobs: torch.Tensor | None = None,  # [num_sampled, k] float32
        out_slot: int | None = None,
    ) -> LaunchedStep:
        """Starts copying the sampled tensors to the host behind the step's work on the stream;
        for a graph step that writes them into the decode inputs' host ring row `out_slot`
        itself, only marks the step's end."""
        outputs = [token_ids, logprobs, top_ids, top_logprobs]
        on_cuda = self.device.type == "cuda"
        if out_slot is not None:
            n = len(sampling)
            inputs = self.decode_inputs
            host = [inputs.host_token_ids[out_slot, :n], inputs.host_logprobs[out_slot, :n], None, None]
        elif not on_cuda:  # copies, since the graph outputs are rewritten next step
            host = [t.clone() if t is not None else None for t in outputs]
        else:
            # fresh pinned tensors: the caching host allocator reuses one only after its copy is done
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                    if t is not None else None for t in outputs]
        done = torch.cuda.Event() if on_cuda else None
        if done is not None:
            done.record()
        return LaunchedStep(scheduled, sampling, token_ids, host, done, out_slot)

    def collect(self, step: LaunchedStep) -> dict[int, list[SampledToken]]:
        """Waits for a launched step's tokens; returns each sampling sequence's tokens (one, or
        a verify step's accepted drafts and the token after them), by seq_id."""
        if step.verified is not None:
            return step.verified
        if step.done is not None:
            step.done.synchronize()  # the step's one host synchronisation
        if not step.sampling:
            return {}
        token_ids, logprobs, top_ids, top_logprobs = step.host
        ids, lps = token_ids.tolist(), logprobs.tolist()
        if step.out_slot is not None:
            self.decode_inputs.release_slot(step.out_slot)
        top_ids = top_ids.tolist() if top_ids is not None else None
        top_vals = top_logprobs.tolist() if top_logprobs is not None else None
        result = {}
        for i, seq in enumerate(step.sampling):
            n = seq.params.logprobs or 0
            top = list(zip(top_ids[i][:n], top_vals[i][:n])) if top_ids is not None and n else []
            result[seq.seq_id] = [SampledToken(ids[i], lps[i], top)]
        return result
