"""Request outputs as they cross the pipe between the engine process and the server: only what is new.

The Engine hands out cumulative RequestOutputs (all text and tokens so far), and the server's streams
want them that way. Sending them whole would pickle every request's prompt and growing token list
once a step, in the engine process, on the loop that feeds the GPU. So the engine side
(`DeltaEncoder`) sends each request's new text, tokens and logprobs since its last output, and its
prompt once, with its first output; the server side (`OutputAssembler`) appends them and rebuilds the
cumulative RequestOutput.

This relies on the engine's text being append-only between a request's outputs. It is: the
detokenizer only appends, and text held back because it may start a stop string is a prefix of the
text that later outputs show (a stop string found later starts at or after what was shown).
"""

from __future__ import annotations

from hotpath.outputs import CompletionOutput, Logprob, RequestOutput

# Deltas travel as plain tuples: pickle writes those in C, while a NamedTuple or dataclass costs a
# Python-level __reduce__ per object (an order of magnitude per message: docs/decisions.md, server).
SeqDelta = tuple[
    int,  # index of the choice
    str,  # text to append
    list[int],  # new token ids
    list[dict[int, Logprob]] | None,  # one entry per new token; None without logprobs
    float | None,  # cumulative_logprob
    str | None,  # finish_reason
    int | str | None,  # stop_reason
]
RequestDelta = tuple[
    str,  # request_id
    tuple[str | None, list[int]] | None,  # (prompt, prompt_token_ids), with the first output only
    list[SeqDelta],
    bool,  # finished
    int,  # num_cached_tokens
    dict[str, float],  # metrics
]


class DeltaEncoder:
    """Engine side: remembers what was sent of each request."""

    def __init__(self) -> None:
        self._sent: dict[str, list[tuple[int, int]]] = {}  # request id -> per seq (chars, tokens)

    def encode(self, out: RequestOutput) -> RequestDelta:
        sent = self._sent.get(out.request_id)
        prompt = None
        if sent is None:
            sent = [(0, 0)] * len(out.outputs)
            prompt = (out.prompt, out.prompt_token_ids)
        seqs = []
        for o in out.outputs:
            chars, tokens = sent[o.index]
            seqs.append((o.index, o.text[chars:], o.token_ids[tokens:],
                         None if o.logprobs is None else o.logprobs[tokens:],
                         o.cumulative_logprob, o.finish_reason, o.stop_reason))
            sent[o.index] = (len(o.text), len(o.token_ids))
        if out.finished:
            self._sent.pop(out.request_id, None)
        else:
            self._sent[out.request_id] = sent
        return out.request_id, prompt, seqs, out.finished, out.num_cached_tokens, out.metrics

    def forget(self, request_id: str) -> None:
        """For an aborted request, which gets no further output."""
        self._sent.pop(request_id, None)


class _Seq:
    __slots__ = ("text", "token_ids", "logprobs", "cumulative_logprob", "finish_reason", "stop_reason")

    def __init__(self, with_logprobs: bool) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[dict[int, Logprob]] | None = [] if with_logprobs else None
        self.cumulative_logprob: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None


class AssembledRequest:
    """One request's outputs so far, appended to as its deltas arrive; `output()` builds the
    cumulative RequestOutput only when a consumer reads it, so a stream read once for several steps'
    deltas (a server behind its engine) builds it once."""

    __slots__ = ("request_id", "prompt", "prompt_token_ids", "seqs", "finished", "num_cached_tokens", "metrics")

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], seqs: list[_Seq]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.seqs = seqs
        self.finished = False
        self.num_cached_tokens = 0
        self.metrics: dict[str, float] = {}

    def output(self) -> RequestOutput:
        # copies: a consumer may still hold an earlier output while later tokens arrive
        outputs = [CompletionOutput(i, s.text, list(s.token_ids), s.cumulative_logprob,
                                    None if s.logprobs is None else list(s.logprobs), s.finish_reason,
                                    s.stop_reason)
                   for i, s in enumerate(self.seqs)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, self.finished,
                             self.num_cached_tokens, self.metrics)


class OutputAssembler:
    """Server side: appends each request's deltas to its AssembledRequest."""

    def __init__(self) -> None:
        self._requests: dict[str, AssembledRequest] = {}

    def apply(self, delta: RequestDelta) -> AssembledRequest:
        request_id, first_prompt, seq_deltas, finished, num_cached_tokens, metrics = delta
        state = self._requests.get(request_id)
        if state is None:
            prompt, prompt_token_ids = first_prompt
            state = AssembledRequest(request_id, prompt, prompt_token_ids,
                                     [_Seq(d[3] is not None) for d in seq_deltas])
            self._requests[request_id] = state
        # every delta carries each of the request's choices (the engine's outputs do)
        for index, text, token_ids, logprobs, cumulative_logprob, finish_reason, stop_reason in seq_deltas:
            seq = state.seqs[index]
            seq.text += text
            seq.token_ids += token_ids
            if seq.logprobs is not None:
                seq.logprobs += logprobs
            seq.cumulative_logprob, seq.finish_reason, seq.stop_reason = cumulative_logprob, finish_reason, stop_reason
        state.finished, state.num_cached_tokens, state.metrics = finished, num_cached_tokens, metrics
        if finished:
            del self._requests[request_id]
        return state

    def forget(self, request_id: str) -> None:
        """For an aborted request: its later deltas, if any were in flight, are dropped unread."""
        self._requests.pop(request_id, None)
