"""The engine's side of structured output: each constrained sequence's grammar matcher, the wait
for its compile, the tokens it accepts, and each step's token mask.

A request's constraint is checked when it is added (ValueError naming the reason) and compiled on
the cache's thread pool; its sequences wait in the scheduler until the compile is done (`ready`),
then each gets a matcher of its own (a copy of the compiled one: n > 1 sequences diverge). The
engine fills a step's mask after the previous step's tokens are accepted, while the device runs
the step's forward, and the runner applies it to the logits before sampling (docs/decisions.md).
With a reasoning parser, a sequence's grammar waits for its reasoning block (reasoning.py)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hotpath.sampling_params import SamplingParams
from hotpath.structured.backend import GrammarBackend, grammar_text
from hotpath.structured.bitmask import TokenMask, bitmask_words
from hotpath.structured.compile_cache import CompileCache
from hotpath.structured.reasoning import ANSWER, REASONING, UNDECIDED, ReasoningGate

if TYPE_CHECKING:
    import llguidance

    from hotpath.engine.sequence import Sequence

logger = logging.getLogger("hotpath")


@dataclass
class SeqGrammar:
    """One sequence's constraint: its compile (shared with the request's other sequences and
    with every request of the same constraint), then its own matcher."""

    key: tuple[str, str]  # (kind, spec)
    compiled: Future
    matcher: llguidance.LLMatcher | None = None
    phase: str = ANSWER  # REASONING / UNDECIDED: the grammar waits (reasoning.py)
    reasoning_from: int = 0  # where in the sequence's text its reasoning began

    @property
    def ready(self) -> bool:
        return self.matcher is not None


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int], pin_memory: bool,
                 cache_entries: int = 256, reasoning_parser: str | None = None) -> None:
        self._tokenizer = tokenizer
        self.reasoning = None if reasoning_parser is None else ReasoningGate.for_parser(reasoning_parser, tokenizer)
        self.vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._pin_memory = pin_memory
        self._cache_entries = cache_entries
        self._backend: GrammarBackend | None = None  # made with the first constrained request
        self.cache: CompileCache | None = None
        self.compiling: list[Sequence] = []  # sequences whose grammar is not ready

    def add(self, params: SamplingParams, seqs: list[Sequence]) -> None:
        """Starts (or finds) the compile of a request's constraint and gives each of its sequences
        a grammar; ValueError naming what is wrong with the constraint."""
        if self._tokenizer is None:
            raise ValueError("structured_outputs needs the tokenizer (skip_tokenizer_init is set)")
        if self._backend is None:
            self._backend = GrammarBackend(self._tokenizer, self.vocab_size, self._eos_token_ids)
            self.cache = CompileCache(self._backend.compile, self._cache_entries)
        constraint = params.structured_outputs
        key = (constraint.kind, constraint.spec)
        compiled = self.cache.get(key)
        if compiled is None:  # checked once per constraint, here: a bad one is the caller's error
            compiled = self.cache.submit(key, grammar_text(constraint))
        phase = ANSWER if self.reasoning is None else self.reasoning.first_phase(self._tokenizer, seqs[0].prompt_token_ids)
        for seq in seqs:
            seq.grammar = SeqGrammar(key, compiled, phase=phase)
        self.compiling += seqs

    def poll(self) -> list[Sequence]:
        """Gives each sequence whose compile is done its matcher; returns those whose compile
        failed (each with finish_reason "abort"), for the engine to finish."""
        if not self.compiling:
            return []
        failed, still = [], []
        for seq in self.compiling:
            grammar = seq.grammar
            if seq.is_finished or grammar is None:
                continue
            if not grammar.compiled.done():
                still.append(seq)
                continue
            error = grammar.compiled.exception()
            if error is None:
                grammar.matcher = grammar.compiled.result().deep_copy()
                continue
            logger.error("request %s: its %s constraint failed to compile: %s", seq.request_id,
                         grammar.key[0], error)
            self.cache.drop(grammar.key)
            seq.finish_reason = "abort"
            failed.append(seq)
        self.compiling = still
        return failed

    def accept(self, seq: Sequence, token_id: int) -> bool:
        """Advances seq's matcher past its sampled token; False once the grammar is complete
        (nothing may follow) or the token broke it, either of which ends the sequence."""
        grammar = seq.grammar
        if grammar.phase != ANSWER:
            was = grammar.phase
            grammar.phase = self.reasoning.after(seq, was, token_id, grammar.reasoning_from)
            if grammar.phase == REASONING and was == UNDECIDED:
                grammar.reasoning_from = len(seq.text)
            if was == REASONING or grammar.phase == REASONING:
                return True  # the block's own tokens, its closing tag among them
        matcher = grammar.matcher
        if not matcher.consume_token(token_id) or matcher.is_error():
            logger.warning("request %s: token %d does not follow its %s constraint (%s)", seq.request_id,
                           token_id, grammar.key[0], matcher.get_error())
            return False
        return not matcher.is_stopped()

    def mask(self, seqs: list[Sequence]) -> TokenMask:
        """The token mask of a step's constrained sequences, each at its matcher's state (every
        token allowed inside a reasoning block; the block's opening tag too where one may open)."""
        # [len(seqs), words] int32: every row written by the fill, or set whole here
        bitmask = torch.empty((len(seqs), bitmask_words(self.vocab_size)), dtype=torch.int32,
                              pin_memory=self._pin_memory)
        if seqs:
            answering = [(seq.grammar.matcher, i) for i, seq in enumerate(seqs) if seq.grammar.phase != REASONING]
            if answering:
                self._backend.fill(answering, bitmask)
            for i, seq in enumerate(seqs):
                phase = seq.grammar.phase
                if phase == REASONING:
                    bitmask[i] = -1
                elif phase == UNDECIDED and self.reasoning.start_id is not None:
                    start = self.reasoning.start_id
                    bitmask[i, start // 32] |= _bit(start % 32)
        return TokenMask([seq.seq_id for seq in seqs], bitmask)


def _bit(b: int) -> int:
    """Bit b of an int32 word, as a signed int32 value (bit 31 is the sign)."""
    return (1 << b) - (1 << 32) if b == 31 else 1 << b
