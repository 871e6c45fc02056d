"""The engine and its single loop: schedule -> run -> sample -> update sequences -> emit outputs.

The engine decides; an executor (hotpath/executor) runs. Each step the engine describes as a plan
(engine/plans.py -> runner/plan.py) and gets its sampled tokens back, from a runner in this process
or from worker processes, one per rank."""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass


from hotpath.args import EngineArgs
from hotpath.engine.kv_cache import KVCacheManager
from hotpath.engine.mm_inputs import MultiModalInputs
from hotpath.engine.plans import PlanBuilder
from hotpath.engine.prompts import eos_token_ids, load_tokenizer, tokenize_prompt
from hotpath.engine.request_outputs import Request, append_token, make_output
from hotpath.engine.scheduler import Scheduler
from hotpath.engine.sequence import Sequence, SequenceStatus
from hotpath.engine.speculation import Speculation
from hotpath.engine.state_snapshots import StateSnapshots
from hotpath.executor import make_executor
from hotpath.multimodal.inputs import ProcessedPrompt
from hotpath.outputs import RequestOutput
from hotpath.resolve import resolve
from hotpath.runner.plan import decode_graph_size
from hotpath.runner.seq_state import is_plain_greedy
from hotpath.sampling_params import SamplingParams
from hotpath.speculative.stats import SpecStats
from hotpath.structured.grammars import StructuredOutputs

logger = logging.getLogger("hotpath")


@dataclass
class InFlight:
    """A launched step whose tokens the engine has not collected."""

    scheduled: list[tuple[Sequence, int]]
    step_id: int
    constrained: list[Sequence]  # sampling rows with structured output: the step waits for their mask


class Engine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        r = resolve(args)
        self.device, self.model_dir, self.model_config, self.config = r.device, r.model_dir, r.model_config, r.config
        self.dtype = r.dtype
        self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(args.tokenizer or r.model_dir)
        if r.draft is not None and self.tokenizer is not None:
            # ids must mean the same text (their embedding tables may be padded to different sizes)
            if load_tokenizer(r.draft.model_dir).get_vocab() != self.tokenizer.get_vocab():
                raise ValueError(f"draft model {r.spec.model} does not share the target's "
                                 "tokenizer (their vocabularies differ)")
        self.spec_config = r.spec
        self.executor = make_executor(r)
        info = self.executor.info
        capacity = info.num_blocks * self.config.block_size
        if capacity < self.config.max_model_len:
            self.executor.shutdown()
            raise ValueError(
                f"max_model_len {self.config.max_model_len} is larger than the KV cache capacity "
                f"({capacity} tokens in {info.num_blocks} blocks); lower max_model_len or "
                "give the cache more memory"
            )
        snapshots = None
        if info.num_snapshots:
            snapshots = StateSnapshots(info.num_snapshots, self.config.block_size,
                                       self.config.state_snapshot_stride // self.config.block_size)
        self.kv_cache = KVCacheManager(info.num_blocks, self.config.block_size,
                                       self.config.enable_prefix_caching, info.num_state_slots, snapshots)
        self.plans = PlanBuilder()
        self.speculation = None if r.spec is None else Speculation(r.spec, self.executor, self.plans)
        self._mtp = r.spec is not None and r.spec.method == "mtp"
        self.spec_stats = SpecStats(0) if self.speculation is None else self.speculation.stats
        self.scheduler = Scheduler(self.config, self.kv_cache,
                                   self.speculation.num_draft_slots if self.speculation else None,
                                   1 + r.num_speculative_tokens)
        self.requests: dict[str, Request] = {}
        # async scheduling pays where the device runs apart from the host: on by default on a GPU
        # (a step that verifies drafts runs synchronously: a drafter needs every token on the host)
        self.async_scheduling = self.device.type == "cuda" if args.async_scheduling is None else args.async_scheduling
        self._in_flight: InFlight | None = None
        self._seq_ids = itertools.count()
        self.eos_token_ids = eos_token_ids(r.model_dir, r.model_config, self.tokenizer)
        self.structured = StructuredOutputs(self.tokenizer, r.model_config.vocab_size, self.eos_token_ids,
                                            pin_memory=self.device.type == "cuda",
                                            reasoning_parser=args.reasoning_parser)
        self.mm_inputs = MultiModalInputs(r.model_config, r.model_dir, self.tokenizer, args)
        logger.info("hotpath engine: %s on %s (%s), KV cache %d tokens", r.model_dir, self.device,
                    str(self.dtype).removeprefix("torch."), capacity)

    def shutdown(self) -> None:
        """Stops the workers (a multi-process executor's); the engine serves nothing after."""
        self.executor.shutdown()

    # ---- requests -----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | dict, params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        """Validates and queues a request; raises ValueError (queueing nothing) on bad input.

        `arrival_time` (time.monotonic()) is when the request reached the caller, so latency
        metrics count the wait before this call; it defaults to now."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        processed = self.process_prompt(prompt)
        text, token_ids = processed.prompt, processed.prompt_token_ids
        max_len = self.config.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(f"prompt is {len(token_ids)} tokens, but max_model_len is {max_len}: "
                             "the prompt must leave room for at least one generated token")
        room = max_len - len(token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        seqs = [Sequence(seq_id=next(self._seq_ids), request_id=request_id, index=i,
                         prompt_token_ids=list(token_ids), params=params, max_tokens=max_tokens,
                         stop_token_ids=stop_ids, mm_items=processed.mm_items) for i in range(params.n)]
        if params.structured_outputs is not None:  # its grammar compiles while it waits
            self.structured.add(params, seqs)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self.requests[request_id] = Request(request_id, text, list(token_ids), params, seqs, arrival)
        for seq in seqs:
            self.scheduler.add(seq)

    def process_prompt(self, prompt: str | list[int] | dict | ProcessedPrompt) -> ProcessedPrompt:
        """A prompt as the engine takes it: token ids and, for an image-text model, its images
        and videos preprocessed (a prompt dict's `multi_modal_data`); ValueError for what
        cannot be a prompt of this model."""
        if isinstance(prompt, ProcessedPrompt):  # preprocessed already (the server's front end)
            if prompt.mm_items:
                self.mm_inputs.check_items(prompt.mm_items)
            return prompt
        if isinstance(prompt, dict) and prompt.get("multi_modal_data"):
            return self.mm_inputs.process(prompt)
        text, token_ids = tokenize_prompt(self.tokenizer, self.model_config.vocab_size, prompt)
        return ProcessedPrompt(text, token_ids, [])

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
            self._forget(seq)

    def _forget(self, seq: Sequence) -> None:
        """Drops what the workers and speculative decoding kept about a finished sequence."""
        self.plans.forget(seq)
        if self.speculation is not None:
            self.speculation.forget(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine iteration. Returns the requests that produced tokens or finished.

        With async scheduling, a step whose sampling rows are all plain greedy or constrained
        (structured output) stays in flight when this returns: the next call schedules and
        launches the step after it (whose pending input tokens are this one's sampled ids, still
        on the device) and only then waits for this one's tokens, so the host's work overlaps the
        device's. A constrained row's mask needs those tokens: the step is launched to its logits,
        the previous tokens are collected and accepted by the grammars, the mask is filled while
        the forward runs, and the step then samples with it. Anything else runs synchronously,
        after draining the step in flight. A sequence that finishes in step N was launched once more in step N+1 (its stop
        was not known yet): that token is discarded, never emitted."""
        touched: dict[str, Request] = {}
        for seq in self.structured.poll():  # a grammar that failed to compile ends its sequence
            self.scheduler.finish(seq)
            touched[seq.request_id] = self.requests[seq.request_id]
        spec = self.speculation
        if spec is not None:
            spec.begin_step(self.scheduler.running, bool(self.scheduler.waiting))
        sched = self.scheduler.schedule()
        prev, self._in_flight = self._in_flight, None
        if prev is not None and not self._continues(sched.scheduled):
            self._collect(prev, touched)  # this step needs every token on the host first
            prev = None
        start = time.perf_counter()  # timed past that wait
        # sequences that finished as the drained step's tokens arrived need nothing more
        scheduled = [(seq, n) for seq, n in sched.scheduled if not seq.is_finished]
        timed = False
        if spec is not None:
            timed = spec.timed(scheduled)
            scheduled = spec.propose(scheduled)
            drafts = max((n - 1 for _, n in scheduled), default=0)  # the step's k, as verified
        if scheduled:
            overlap = self._can_overlap(scheduled)
            launched = self._launch(scheduled, prev)
            if launched.constrained:  # its forward runs while the mask is filled, after prev's tokens
                if prev is not None:
                    self._collect(prev, touched)
                    prev = None
                self._sample_masked(launched)
            if overlap:
                self._in_flight = launched
                timed = timed and prev is not None  # waited for one step, as pipelined steps do
            else:
                self._collect(launched, touched)
        if prev is not None:
            self._collect(prev, touched)
        if timed:  # the step's time, for the choice of k at this batch size
            spec.policy.record_step(len(scheduled), drafts, time.perf_counter() - start)
        if spec is not None and spec.policy.exploring is not None:
            spec.policy.record_exploration(time.perf_counter() - start)  # drafters' catch-up too
        return self._outputs(touched)

    def _can_overlap(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Whether this step may run while the host schedules the next one: every row that
        samples is plain greedy, so the next step can take its token on the device as it is.
        Prefill chunks that sample nothing may ride along (a mixed step's host work then hides
        behind the previous step's device time too)."""
        return self.async_scheduling and bool(scheduled) and all(
            is_plain_greedy(seq) or seq.grammar is not None  # (a constrained row samples after prev)
            for seq, n in scheduled if seq.num_computed_tokens + n == seq.num_tokens
        ) and not any(n > 1 and seq.is_decoding for seq, n in scheduled)  # a verify step

    def _continues(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Whether this step can be launched before the previous one's tokens are on the host: it
        could overlap, and its rows' input tokens are where its path reads them. An eager step
        takes each pending token from the previous step's sampled ids and the rest from the host;
        a decode graph takes every row's from there, so there every row must decode a token the
        previous step sampled (a decode the token budget left out of it has its input on the host)."""
        if not self._can_overlap(scheduled):
            return False
        graph = decode_graph_size(scheduled, self.executor.info.graph_sizes) > 0
        return not graph or all(seq.num_pending_tokens for seq, _ in scheduled)

    def _launch(self, scheduled: list[tuple[Sequence, int]], prev: InFlight | None) -> InFlight:
        snapshots = self.kv_cache.snapshots
        if snapshots is not None:  # where this step's sequences save their state (hybrids)
            keep = {seq.restore_snapshot for seq, _ in scheduled if seq.restore_snapshot is not None}
            for seq, num_new in scheduled:
                snapshots.plan_save(seq, seq.num_computed_tokens, seq.num_computed_tokens + num_new, keep)
        # the rows that sample: those that reach the sequence's last token (and verify its drafts)
        sampling = [seq for seq, n in scheduled
                    if seq.num_computed_tokens + n - len(seq.draft_token_ids) == seq.num_tokens]
        constrained = [seq for seq in sampling if seq.grammar is not None]
        plan = self.plans.step_plan(scheduled, uses_prev=prev is not None)
        plan.mask_follows = bool(constrained)
        step_id = self.executor.launch(plan)
        for seq, num_new in scheduled:
            seq.num_computed_tokens += num_new
        for seq in sampling:
            seq.num_pending_tokens += 1
        return InFlight(scheduled, step_id, constrained)

    def _sample_masked(self, launched: InFlight) -> None:
        """Fills a launched step's token mask from its constrained sequences' matchers (each has
        accepted every token before this step's) and has the workers sample with it. A sequence
        that finished meanwhile needs no row: its token is dropped."""
        rows = [seq for seq in launched.constrained if not seq.is_finished]
        self.executor.sample(launched.step_id, self.structured.mask(rows))

    def _collect(self, launched: InFlight, touched: dict[str, Request]) -> None:
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
        # what the MTP head (which catches up as the workers collect) must not run over
        gone = [seq.seq_id for seq, _ in launched.scheduled
                if seq.status != SequenceStatus.RUNNING] if self._mtp else []
        sampled = self.executor.collect(launched.step_id, gone)
        now = time.monotonic()
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
                seq.draft_token_ids, seq.draft_probs = [], None
            appended = 0
            for token in tokens:  # stops are checked token by token: the rest is dropped
                appended += 1
                if append_token(self.tokenizer, seq, token):
                    self.scheduler.finish(seq)
                    break
                if seq.grammar is not None and not self.structured.accept(seq, token.token_id):
                    seq.finish_reason = "stop"  # the grammar is complete: nothing may follow
                    self.scheduler.finish(seq)
                    break
            if drafts:
                self.speculation.verified(seq, drafts, accepted, appended)
                if not seq.is_finished:
                    self.kv_cache.trim(seq, seq.num_tokens)
            if req.first_token_time is None:
                req.first_token_time = now
            touched[req.request_id] = req

    def _outputs(self, touched: dict[str, Request]) -> list[RequestOutput]:
        now, speculative, outputs = time.monotonic(), self.speculation is not None, []
        for req in touched.values():
            finished = req.finished
            if finished:
                req.finished_time = now
                del self.requests[req.request_id]
                for seq in req.seqs:
                    self._forget(seq)
            outputs.append(make_output(req, speculative, finished))
        return outputs
