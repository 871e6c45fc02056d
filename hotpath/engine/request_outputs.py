"""A request's tokens turned into what the user sees: tokens appended with their logprobs and
text, stop strings and stop tokens checked, RequestOutputs built."""

from __future__ import annotations

from dataclasses import dataclass

from hotpath.engine.detokenizer import detokenize_step
from hotpath.engine.sequence import Sequence
from hotpath.outputs import CompletionOutput, Logprob, RequestOutput
from hotpath.runner.plan import SampledToken
from hotpath.sampling_params import SamplingParams


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


def append_token(tokenizer, seq: Sequence, token: SampledToken) -> bool:
    """Appends a sampled token to seq (its logprobs and text too); True when it ends the sequence
    (finish_reason set; the caller finishes it)."""
    seq.output_token_ids.append(token.token_id)
    seq.cumulative_logprob += token.logprob
    params = seq.params
    if params.logprobs is not None:
        seq.output_logprobs.append(_logprob_entry(tokenizer, token))
    if tokenizer is not None:
        old_len = len(seq.text)
        seq.text += detokenize_step(tokenizer, seq.output_token_ids, seq.detok, params.skip_special_tokens)
        if params.stop and len(seq.output_token_ids) >= params.min_tokens and _stop_string(seq, old_len):
            return True
    n_out = len(seq.output_token_ids)
    if token.token_id in seq.stop_token_ids and n_out >= params.min_tokens:
        seq.finish_reason = "stop"
        if token.token_id in params.stop_token_ids:  # EOS leaves stop_reason None, as in vLLM
            seq.stop_reason = token.token_id
    elif n_out >= seq.max_tokens:
        seq.finish_reason = "length"
    return seq.finish_reason is not None


def _stop_string(seq: Sequence, old_len: int) -> bool:
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


def _logprob_entry(tokenizer, token: SampledToken) -> dict[int, Logprob]:
    """The sampled token and the top-n, built once when the token is appended."""
    def text(token_id: int) -> str | None:
        return None if tokenizer is None else tokenizer.decode([token_id])

    entry = {tid: Logprob(lp, rank + 1, text(tid)) for rank, (tid, lp) in enumerate(token.top_logprobs)}
    if token.token_id not in entry:
        entry[token.token_id] = Logprob(token.logprob, None, text(token.token_id))
    return entry


def make_output(req: Request, speculative: bool, finished: bool) -> RequestOutput:
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
    if speculative:  # drafts verified for the request, and accepted
        metrics["spec_num_draft_tokens"] = sum(s.num_drafted for s in req.seqs)
        metrics["spec_num_accepted_tokens"] = sum(s.num_accepted for s in req.seqs)
    scheduled = [s.first_scheduled_time for s in req.seqs if s.first_scheduled_time is not None]
    if scheduled:
        metrics["first_scheduled_time"] = min(scheduled)
    if req.first_token_time is not None:
        metrics["first_token_time"] = req.first_token_time
    if req.finished_time is not None:
        metrics["finished_time"] = req.finished_time
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=outs,
        finished=finished,
        num_cached_tokens=req.seqs[0].num_cached_prompt_tokens,
        metrics=metrics,
    )
