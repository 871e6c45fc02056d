"""The engine's side of structured output: each constrained sequence's grammar matcher, the wait
for its compile, the tokens it accepts, and each step's token mask.

A request's constraint is checked when it is added (ValueError naming the reason) and compiled on
the cache's thread pool; its sequences wait in the scheduler until the compile is done (`ready`),
then each gets a matcher of its own (a copy of the compiled one: n > 1 sequences diverge). The
engine fills a step's mask after the previous step's tokens are accepted, while the device runs
the step's forward, and the runner applies it to the logits before sampling (docs/decisions.md)."""

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

    @property
    def ready(self) -> bool:
        return self.matcher is not None


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int], pin_memory: bool,
                 cache_entries: int = 256) -> None:
        self._tokenizer = tokenizer
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
        for seq in seqs:
            seq.grammar = SeqGrammar(key, compiled)
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
        matcher = seq.grammar.matcher
        if not matcher.consume_token(token_id) or matcher.is_error():
            logger.warning("request %s: token %d does not follow its %s constraint (%s)", seq.request_id,
                           token_id, seq.grammar.key[0], matcher.get_error())
            return False
        return not matcher.is_stopped()

    def mask(self, seqs: list[Sequence]) -> TokenMask:
        """The token mask of a step's constrained sequences, each at its matcher's state."""
        # [len(seqs), words] int32: every row written by the fill
        bitmask = torch.empty((len(seqs), bitmask_words(self.vocab_size)), dtype=torch.int32,
                              pin_memory=self._pin_memory)
        if seqs:
            self._backend.fill([seq.grammar.matcher for seq in seqs], bitmask)
        return TokenMask([seq.seq_id for seq in seqs], bitmask)
