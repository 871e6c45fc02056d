"""The grammar library behind structured output: llguidance (why it, not xgrammar: docs/decisions.md,
"Structured output"). Each constraint becomes an llguidance grammar; a compiled grammar is a
matcher that has computed one mask (its lexer built), which each sequence copies; a step's masks
are filled by llguidance's own threads, one bitmask row per constrained sequence."""

from __future__ import annotations

import json
import threading

import llguidance
import llguidance.hf
import torch

from hotpath.sampling_params import StructuredOutputsParams

# Free whitespace off: a model may not loop on spaces or newlines between JSON tokens (vLLM's
# any-whitespace grammars let small models do that until max_tokens); separators as json.dumps
# writes them. A schema's own "x-guidance" options still apply over these.
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(params: StructuredOutputsParams) -> str:
    """The constraint as an llguidance grammar; ValueError naming why it is not a valid one."""
    kind = params.kind
    try:
        if kind in ("json", "json_object"):
            schema = params.spec if kind == "json" else '{"type": "object"}'
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        elif kind == "choice":
            grammar = llguidance.grammar_from("choice", json.dumps(params.choice))
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(params.regex)
        else:  # Lark, or GBNF (rules with ::=), which llguidance turns into Lark
            grammar = llguidance.grammar_from("grammar", params.grammar)
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"structured_outputs.{kind} cannot be used: {e}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise ValueError(f"structured_outputs.{kind} cannot be used: {error.strip()}")
    return grammar


class GrammarBackend:
    """llguidance over the model's tokenizer, whose ids index rows of `vocab_size` logits."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]) -> None:
        if not hasattr(tokenizer, "backend_tokenizer"):
            raise ValueError("structured output needs a fast (tokenizer.json) tokenizer, got "
                             f"{type(tokenizer).__name__}")
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None

    def tokenizer(self) -> llguidance.LLTokenizer:
        """The tokenizer as llguidance walks it (a trie of every token's bytes): built once, on
        the first compile, off the engine's loop (seconds for a 150k-token vocabulary)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self.hf_tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids or None)
            return self._tokenizer

    def compile(self, grammar: str) -> llguidance.LLMatcher:
        """A matcher at the grammar's start, its first mask computed (llguidance builds its lexer
        lazily, on the first mask): sequences copy it. ValueError if the grammar fails."""
        matcher = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0)
        if not matcher.is_error():
            matcher.compute_bitmask()
        if matcher.is_error():
            raise ValueError(f"the grammar cannot be compiled: {matcher.get_error()}")
        return matcher

    def fill(self, rows: list[tuple[llguidance.LLMatcher, int]], bitmask: torch.Tensor) -> None:
        """For each (matcher, i), row i of `bitmask` ([rows, words] int32, host memory) gets the
        tokens the matcher allows next: bit t % 32 of word t // 32 set where token t is allowed."""
        # (as llguidance.torch's fill_next_token_bitmask_par, whose module compiles a torch
        # function at import: that import would bring in triton and inductor)
        assert bitmask.dtype == torch.int32 and bitmask.is_contiguous() and not bitmask.is_cuda
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        assert all(0 <= i < bitmask.shape[0] for _, i in rows)
        self._executor.unsafe_compute_mask_ptr(rows, bitmask.data_ptr(),
                                               bitmask.shape[1] * 4, bitmask.shape[0])
