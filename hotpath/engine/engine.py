"""The engine and its single loop: schedule -> run -> sample -> update sequences -> emit outputs."""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hotpath.config import EngineConfig, ModelConfig
from hotpath.engine.args import EngineArgs
from hotpath.engine.detokenizer import detokenize_step
from hotpath.engine.kv_cache import KVCacheManager
from hotpath.engine.scheduler import Scheduler
from hotpath.engine.sequence import Sequence
from hotpath.engine.spec.config import SpeculativeConfig
from hotpath.engine.spec.drafters import make_drafter
from hotpath.engine.spec.policy import CATCH_UP_TIMED, DraftLengthPolicy
from hotpath.engine.spec.stats import SpecStats
from hotpath.engine.state_snapshots import StateSnapshots
from hotpath.layers.quant.detect import read_quant_config
from hotpath.models.registry import read_config
from hotpath.outputs import CompletionOutput, Logprob, RequestOutput
from hotpath.runner.model_runner import (
    SPEC_GRAPH_MAX_ROWS,
    LaunchedStep,
    ModelRunner,
    SampledToken,
    is_plain_greedy,
)
from hotpath.sampling_params import SamplingParams

logger = logging.getLogger("hotpath")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def resolve_model_dir(model: str | None) -> Path:
    """A known asset name, an HF directory or a .gguf file -> an HF-style directory."""
    from hotpath.assets import resolve_model

    path = resolve_model(model)
    if path.is_file():
        from hotpath.loader.gguf import gguf_to_hf_dir  # the gguf package only when needed

        return gguf_to_hf_dir(path)
    return path


class Engine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = _resolve_device(args.device)
        model_dir = resolve_model_dir(args.model)
        self.model_dir = model_dir
        self.model_config = read_config(model_dir)
        self.model_config.quantization = read_quant_config(model_dir, args.quantization)
        self.dtype = self._resolve_dtype(args.dtype)
        self.tokenizer = None if args.skip_tokenizer_init else _load_tokenizer(args.tokenizer or model_dir)
        max_positions = self.model_config.max_position_embeddings
        max_model_len = args.max_model_len or max_positions
        if max_model_len > max_positions:
            raise ValueError(
                f"max_model_len {max_model_len} is larger than the model's "
                f"max_position_embeddings ({max_positions}): positions past it were never trained"
            )
        self.config = EngineConfig(
            max_model_len=max_model_len,
            block_size=args.block_size,
            enable_prefix_caching=args.enable_prefix_caching,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens or max(8192, args.max_num_seqs),
            gpu_memory_utilization=args.gpu_memory_utilization,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            state_snapshot_stride=args.state_snapshot_stride,
            kv_cache_dtype=args.kv_cache_dtype,
        )
        self.spec_config = SpeculativeConfig.parse(args.speculative_config)
        draft = self._draft_model() if self.spec_config and self.spec_config.method == "draft_model" else None
        self.runner = ModelRunner(
            self.model_config, self.config, model_dir, args.load_format, self.device, self.dtype,
            args.seed, args.enforce_eager, draft,
            self.spec_config.num_speculative_tokens if self.spec_config else 0,
            mtp=self.spec_config is not None and self.spec_config.method == "mtp",
        )
        capacity = self.runner.num_blocks * self.config.block_size
        if capacity < max_model_len:
            raise ValueError(
                f"max_model_len {max_model_len} is larger than the KV cache capacity "
                f"({capacity} tokens in {self.runner.num_blocks} blocks); lower max_model_len or "
                "give the cache more memory"
            )
        snapshots = None
        if self.runner.state_layers and self.config.enable_prefix_caching:
            snapshots = StateSnapshots(self.runner.num_snapshots, self.config.block_size,
                                       self.config.state_snapshot_stride // self.config.block_size)
        self.kv_cache = KVCacheManager(
            self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching,
            self.runner.num_state_slots, snapshots,
        )
        self.drafter = None
        if self.spec_config is not None:
            self.drafter = make_drafter(self.spec_config, self.runner, self.config.max_num_batched_tokens)
        self.spec_stats = SpecStats(self.spec_config.num_speculative_tokens if self.spec_config else 0)
        self.spec_policy = None if self.spec_config is None else DraftLengthPolicy(
            self.spec_config.num_speculative_tokens, self.spec_config.adaptive)
        self._step_drafts = 0  # the drafts this step's decoding sequences may verify
        self._drafting_rows_left = 0  # sequences this step may still give draft slots
        self.scheduler = Scheduler(self.config, self.kv_cache, self._num_draft_slots if self.spec_config else None,
                                   1 + self.runner.num_speculative_tokens)
        self.requests: dict[str, Request] = {}
        # async scheduling pays where the device runs apart from the host: on by default on a GPU
        # (a step that verifies drafts runs synchronously: a drafter needs every token on the host)
        self.async_scheduling = (
            self.device.type == "cuda" if args.async_scheduling is None else args.async_scheduling
        )
        self._in_flight: LaunchedStep | None = None  # a launched step not collected yet
        self._seq_ids = itertools.count()
        self.eos_token_ids = self._eos_token_ids()
        torch.manual_seed(args.seed)
        logger.info(
            "hotpath engine: %s on %s (%s), KV cache %d tokens",
            model_dir, self.device, str(self.dtype).removeprefix("torch."), capacity,
        )

    # ---- set-up helpers -----------------------------------------------------------------
    def _draft_model(self) -> tuple[ModelConfig, Path]:
        """The draft model's config and directory, checked against the target: it must share
        the tokenizer (ids mean the same text; their embedding tables may be padded to different
        sizes, as Qwen2.5-Coder-0.5B's 151,936 rows against the 32B's 152,064)."""
        draft_dir = resolve_model_dir(self.spec_config.model)
        cfg = read_config(draft_dir)
        cfg.quantization = read_quant_config(draft_dir, None)
        if self.tokenizer is not None:
            draft_tok = _load_tokenizer(draft_dir)
            if draft_tok.get_vocab() != self.tokenizer.get_vocab():
                raise ValueError(f"draft model {self.spec_config.model} does not share the target's "
                                 "tokenizer (their vocabularies differ)")
        return cfg, draft_dir

    def _num_draft_slots(self, seq: Sequence) -> int:
        """Drafts a decoding sequence may verify this step: the step's k, fewer near max_tokens
        (a step emits at most drafts + 1 tokens), none past SPEC_GRAPH_MAX_ROWS sequences."""
        if self._drafting_rows_left <= 0:
            return 0
        slots = max(0, min(self._step_drafts, seq.max_tokens - seq.num_output_tokens - 1))
        self._drafting_rows_left -= slots > 0
        return slots

    def _resolve_dtype(self, dtype: str) -> torch.dtype:
        if dtype == "auto":
            return self.model_config.default_dtype(self.device)
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
        return DTYPES[dtype]

    def _eos_token_ids(self) -> set[int]:
        """EOS ids as HF generate uses them: generation_config.json first, then config.json."""
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                return set([eos] if isinstance(eos, int) else eos)
        if self.model_config.eos_token_id:
            return set(self.model_config.eos_token_id)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return {self.tokenizer.eos_token_id}
        return set()

    # ---- requests -----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict,
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Validates and queues a request; raises ValueError (queueing nothing) on bad input.

        `arrival_time` (time.monotonic()) is when the request reached the caller, so latency
        metrics count the wait before this call; it defaults to now."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        text, token_ids = self.tokenize_prompt(prompt)
        max_len = self.config.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but max_model_len is {max_len}: "
                "the prompt must leave room for at least one generated token"
            )
        room = max_len - len(token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        seqs = []
        for i in range(params.n):
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device).manual_seed(params.seed + i)
            seqs.append(Sequence(
                seq_id=next(self._seq_ids), request_id=request_id, index=i,
                prompt_token_ids=list(token_ids), params=params, max_tokens=max_tokens,
                stop_token_ids=stop_ids, generator=gen,
            ))
        arrival = time.monotonic() if arrival_time is None else arrival_time
        req = Request(request_id, text, list(token_ids), params, seqs, arrival)
        self.requests[request_id] = req
        for seq in seqs:
            self.scheduler.add(seq)

    def tokenize_prompt(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        text = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:  # "prompt" may ride along as the text it came from
                text = prompt.get("prompt")
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer (skip_tokenizer_init is set); pass prompt_token_ids")
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            text = prompt
        else:
            token_ids = list(prompt)
            vocab = self.model_config.vocab_size
            bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        if not token_ids:
            raise ValueError("the prompt is empty")
        return text, token_ids

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
            self._forget_drafts(seq)

    def _forget_drafts(self, seq: Sequence) -> None:
        """Drops what speculative decoding kept about a finished sequence."""
        if self.spec_policy is not None:
            self.spec_policy.forget(seq)
            self.drafter.forget(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine iteration. Returns the requests that produced tokens or finished.

        With async scheduling, a step whose sampling rows are all plain greedy (decodes, and
        prefill chunks beside them) stays in flight when this returns: the next call schedules
        and launches the step after it (whose pending input tokens are this one's sampled ids,
        still on the device) and only then waits for this one's tokens, so the host's work
        overlaps the device's. Anything else runs synchronously, after draining
        the step in flight. A sequence that finishes in step N was launched once more in step N+1
        (its stop was not known yet): that token is discarded, never emitted."""
        if self.spec_policy is not None:
            decoding = [s for s in self.scheduler.running if s.is_decoding]
            prefilling = len(decoding) < len(self.scheduler.running) or bool(self.scheduler.waiting)
            self._step_drafts = self.spec_policy.choose(decoding, prefilling, self.drafter.behind(decoding))
            self._drafting_rows_left = SPEC_GRAPH_MAX_ROWS
        sched = self.scheduler.schedule()
        touched: dict[str, Request] = {}
        prev, self._in_flight = self._in_flight, None
        if prev is not None and not self._continues(prev, sched.scheduled):
            self._collect(prev, touched)  # this step needs every token on the host first
            prev = None
        start = time.perf_counter()  # timed past that wait
        # sequences that finished as the drained step's tokens arrived need nothing more
        scheduled = [(seq, n) for seq, n in sched.scheduled if not seq.is_finished]
        timed = False
        if self.drafter is not None:
            # a pure decode step is timed, unless a drafter first catches up on a whole prompt
            far = max((self.drafter.behind([seq]) for seq, n in scheduled if n > 1), default=0)
            timed = bool(scheduled) and all(seq.is_decoding for seq, _ in scheduled)
            timed = timed and far <= 1 + self.spec_config.num_speculative_tokens
            scheduled = self._propose(scheduled)
            drafts = max((n - 1 for _, n in scheduled), default=0)  # the step's k, as verified
        if scheduled:
            overlap = self._can_overlap(scheduled)
            launched = self._launch(scheduled, prev)
            if overlap:
                self._in_flight = launched
                timed = timed and prev is not None  # waited for one step, as pipelined steps do
            else:
                self._collect(launched, touched)
        if prev is not None:
            self._collect(prev, touched)
        if timed:  # the step's time, for the choice of k at this batch size
            self.spec_policy.record_step(len(scheduled), drafts, time.perf_counter() - start)
        if self.spec_policy is not None and self.spec_policy.exploring is not None:
            self.spec_policy.record_exploration(time.perf_counter() - start)  # drafters' catch-up too
        return self._outputs(touched)

    def _propose(self, scheduled: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """Drafts for the decoding sequences given draft slots; each then feeds its last token
        and its drafts (the drafter may propose fewer than its slots, or none)."""
        drafting = [(seq, n - 1) for seq, n in scheduled if n > 1 and seq.is_decoding]
        if not drafting:
            return scheduled
        seqs = [seq for seq, _ in drafting]
        behind, start = self.drafter.behind(seqs), time.perf_counter()
        self.drafter.propose(seqs, [k for _, k in drafting])  # ends with the drafts on the host
        if behind >= CATCH_UP_TIMED:  # a long catch-up (a prompt): its cost a token, for the policy
            self.spec_policy.record_catch_up(behind, time.perf_counter() - start)
        for seq in seqs:
            if not seq.draft_token_ids:  # slots that gained nothing (no n-gram match)
                self.spec_policy.record_no_drafts(seq)
        ids = {seq.seq_id for seq, _ in drafting}
        return [(seq, 1 + len(seq.draft_token_ids)) if seq.seq_id in ids else (seq, n) for seq, n in scheduled]

    def _can_overlap(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Whether this step may run while the host schedules the next one: every row that
        samples is plain greedy, so the next step can take its token on the device as it is.
        Prefill chunks that sample nothing may ride along (a mixed step's host work then hides
        behind the previous step's device time too)."""
        return self.async_scheduling and bool(scheduled) and all(
            is_plain_greedy(seq) for seq, n in scheduled if seq.num_computed_tokens + n == seq.num_tokens
        ) and not any(n > 1 and seq.is_decoding for seq, n in scheduled)  # a verify step

    def _continues(self, prev: LaunchedStep, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Whether this step can be launched before `prev`'s tokens are on the host: it could
        overlap, and its rows' input tokens are where its path reads them. An eager step takes
        each pending token from prev's sampled ids and the rest from the host; a decode graph
        takes every row's from prev, so there every row must decode a token prev sampled (a
        decode the token budget left out of prev has its input token on the host only)."""
        if not self._can_overlap(scheduled):
            return False
        return not self.runner.uses_graph(scheduled) or all(seq.num_pending_tokens for seq, _ in scheduled)

    def _launch(self, scheduled: list[tuple[Sequence, int]], prev: LaunchedStep | None) -> LaunchedStep:
        snapshots = self.kv_cache.snapshots
        if snapshots is not None:  # where this step's sequences save their state (hybrids)
            keep = {seq.restore_snapshot for seq, _ in scheduled if seq.restore_snapshot is not None}
            for seq, num_new in scheduled:
                snapshots.plan_save(seq, seq.num_computed_tokens, seq.num_computed_tokens + num_new, keep)
        launched = self.runner.launch(scheduled, prev)
        for seq, num_new in scheduled:
            seq.num_computed_tokens += num_new
        for seq in launched.sampling:
            seq.num_pending_tokens += 1
        return launched

    def _collect(self, launched: LaunchedStep, touched: dict[str, Request]) -> None:
        """Waits for a launched step's tokens and appends them, checking stops; adds each request
        that got one to `touched`.

        A sequence found finished here stopped (or was aborted) after this step was launched: its
        token is dropped. Freeing blocks while steps that use them are in flight is safe:
        - A sequence that stops here (step N) is in step N+1 too, launched before its stop was
          known, which still reads its blocks and writes its dropped token's K/V into one of
          them. The freed blocks can be handed out only by a later schedule(), so only to step
          N+2 or later, which is launched after N+1 on the same stream and therefore runs after
          it: no step touches them while N+1 does.
        - A prefix-cache hit on one of them reads K/V written by steps up to N; N+1's extra write
          lands past the registered blocks (a block is registered only once its tokens are all
          on the host, and the dropped token never is).
        - The same holds for an abort or a preemption between steps: the blocks of a step in
          flight are reused only by steps queued behind it."""
        sampled = self.runner.collect(launched)
        now = time.monotonic()
        kept: list[tuple[Sequence, int]] = []  # verify rows of a hybrid: tokens kept of the step
        for seq, _ in launched.scheduled:
            if seq.is_finished:
                continue
            # before the token is appended: blocks whose K/V only a step still in flight computes
            # are registered when that step is collected, as without async scheduling
            self.kv_cache.cache_full_blocks(seq)
            tokens = sampled.get(seq.seq_id)
            if tokens is None:  # a prefill chunk: nothing sampled
                continue
            seq.num_pending_tokens -= 1
            req = self.requests[seq.request_id]
            drafts = len(seq.draft_token_ids)
            if drafts:  # a verify step: the rejected drafts' K/V are not the sequence's
                accepted = len(tokens) - 1
                seq.num_computed_tokens -= drafts - accepted
                kept.append((seq, accepted + 1))
                self.spec_policy.record_acceptance(seq, drafts, accepted)
                seq.draft_token_ids, seq.draft_probs = [], None
            appended = 0
            for token in tokens:  # stops are checked token by token: the rest is dropped
                self._append_token(req, seq, token)
                appended += 1
                if seq.is_finished:
                    break
            if drafts:  # counted as accepted: the drafts that reached the output
                seq.num_drafted += drafts
                seq.num_accepted += min(accepted, appended)
                self.spec_stats.record(drafts, min(accepted, appended))
                if not seq.is_finished:
                    self.kv_cache.trim(seq, seq.num_tokens)
            if req.first_token_time is None:
                req.first_token_time = now
            touched[req.request_id] = req
        kept = [(seq, n) for seq, n in kept if not seq.is_finished]
        if kept and self.runner.state_layers:  # the linear-attention state back to the last kept token
            self.runner.rollback_states(kept)
        if self.drafter is not None:
            self.drafter.collected(launched)

    def _outputs(self, touched: dict[str, Request]) -> list[RequestOutput]:
        now = time.monotonic()
        outputs = []
        for req in touched.values():
            if req.finished:
                req.finished_time = now
                del self.requests[req.request_id]
                for seq in req.seqs:
                    self._forget_drafts(seq)
            outputs.append(self._make_output(req))
        return outputs

    def _append_token(self, req: Request, seq: Sequence, token: SampledToken) -> None:
        seq.output_token_ids.append(token.token_id)
        seq.cumulative_logprob += token.logprob
        if seq.params.logprobs is not None:
            seq.output_logprobs.append(self._logprob_entry(token))
        params = seq.params
        if self.tokenizer is not None:
            old_len = len(seq.text)
            seq.text += detokenize_step(
                self.tokenizer, seq.output_token_ids, seq.detok, params.skip_special_tokens
            )
            if params.stop and len(seq.output_token_ids) >= params.min_tokens:
                if self._check_stop_strings(seq, old_len):
                    self.scheduler.finish(seq)
                    return
        n_out = len(seq.output_token_ids)
        if token.token_id in seq.stop_token_ids and n_out >= params.min_tokens:
            seq.finish_reason = "stop"
            if token.token_id in params.stop_token_ids:  # EOS leaves stop_reason None, as in vLLM
                seq.stop_reason = token.token_id
        elif n_out >= seq.max_tokens:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)

    @staticmethod
    def _check_stop_strings(seq: Sequence, old_len: int) -> bool:
        for stop in seq.params.stop:
            # only a match that ends in the newly added text is new
            idx = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if idx != -1:
                end = idx + len(stop) if seq.params.include_stop_str_in_output else idx
                seq.text = seq.text[:end]
                seq.finish_reason = "stop"
                seq.stop_reason = stop
                return True
        return False

    def _make_output(self, req: Request) -> RequestOutput:
        outs = []
        for seq in req.seqs:
            text = seq.text
            if not seq.is_finished and seq.params.stop and not seq.params.include_stop_str_in_output:
                # hold back what could be the start of a stop string, so it is never streamed
                hold = max(len(s) for s in seq.params.stop) - 1
                text = text[: max(0, len(text) - hold)]
            outs.append(CompletionOutput(
                index=seq.index,
                text=text,
                token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob if seq.params.logprobs is not None else None,
                logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            ))
        metrics = {"arrival_time": req.arrival_time}
        if self.spec_config is not None:  # drafts verified for the request, and accepted
            metrics["spec_num_draft_tokens"] = sum(s.num_drafted for s in req.seqs)
            metrics["spec_num_accepted_tokens"] = sum(s.num_accepted for s in req.seqs)
        if req.first_token_time is not None:
            metrics["first_token_time"] = req.first_token_time
        if req.finished_time is not None:
            metrics["finished_time"] = req.finished_time
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=outs,
            finished=req.finished,
            num_cached_tokens=req.seqs[0].num_cached_prompt_tokens,
            metrics=metrics,
        )

    def _logprob_entry(self, token: SampledToken) -> dict[int, Logprob]:
        """The sampled token and the top-n, built once when the token is appended."""
        entry = {tid: Logprob(lp, rank + 1, self._decode_one(tid))
                 for rank, (tid, lp) in enumerate(token.top_logprobs)}
        if token.token_id not in entry:
            entry[token.token_id] = Logprob(token.logprob, None, self._decode_one(token.token_id))
        return entry

    def _decode_one(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA GPU is available")
    return dev


def _load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load a tokenizer from {path}: {e}. Pass tokenizer=... or "
            "skip_tokenizer_init=True with token-id prompts"
        ) from e
