"""xgrammar against llguidance on the host work structured output adds: the tokenizer's one-time
preparation, compiling a nested JSON schema (and a regex), and the per-token mask fill at a
151,936-entry vocabulary, one matcher at a time and a batch of 64 matchers per step.

Each matcher walks a valid instance of its schema token by token (the instance tokenized as the
model would write it), so every fill is one a decode step would ask for. CPU only.

    python benchmarks/grammar_backends.py --tokenizer .whl/qwen3-tokenizer
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoTokenizer

VOCAB = 151936  # Qwen2.5 / Qwen3's embedding rows (the tokenizer holds fewer ids)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "scores": {"type": "array", "items": {"type": "number"}},
        "manager": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"name": {"type": "string"}},
                                                  "required": ["name"]}]},
    },
    "required": ["name", "age", "role", "address", "tags"],
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "role": "admin",
            "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
            "tags": ["math", "engines", "poetry"], "scores": [9.5, 10, 8.25], "manager": {"name": "Babbage"}}
REGEX = r"[A-Z][a-z]{2,10}-[0-9]{4}-(alpha|beta|gamma)"
REGEX_TEXT = "Hotpath-2026-gamma"


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    """Median seconds of `repeat` calls, and the last call's result."""
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.setup_s, self.info = timed(lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB))
        self.batch = xgr.BatchGrammarMatcher(max_threads="auto")

    def compile_schema(self):
        # a fresh compiler each time: its cache would otherwise answer the repeats
        return self.xgr.GrammarCompiler(self.info, cache_enabled=False).compile_json_schema(json.dumps(SCHEMA))

    def compile_regex(self):
        return self.xgr.GrammarCompiler(self.info, cache_enabled=False).compile_regex(REGEX)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, matchers, bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.setup_s, self.info = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=VOCAB))
        self.executor = llguidance.LLExecutor()

    def _matcher(self, grammar: str):
        m = self.ll.LLMatcher(self.info, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    # llguidance builds its lexer and parser lazily: a matcher is its compiled form
    def compile_schema(self):
        return self._matcher(self.ll.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))

    def compile_regex(self):
        return self._matcher(self.ll.LLMatcher.grammar_from_regex(REGEX))

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        self.ll.torch.fill_next_token_bitmask(matcher, bitmask, row)

    def fill_batch(self, matchers, bitmask: torch.Tensor) -> None:
        self.ll.torch.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


def walk(backend, compiled, tokens: list[int], bitmask: torch.Tensor) -> list[float]:
    """Fills the mask before each token of `tokens` and accepts it: each fill's seconds."""
    matcher = backend.matcher(compiled)
    times = []
    for token in tokens:
        start = time.perf_counter()
        backend.fill(matcher, bitmask, 0)
        times.append(time.perf_counter() - start)
        word, bit = divmod(token, 32)
        assert (int(bitmask[0, word]) >> bit) & 1, f"{backend.name}: the mask refuses token {token}"
        assert backend.accept(matcher, token), f"{backend.name}: token {token} not accepted"
    return times


def batch_steps(backend, compiled, tokens: list[int], batch: int, together: bool) -> list[float]:
    """`batch` matchers, row i starting i tokens into the instance (so a step holds rows at every
    point of it, as a running batch does), filled per step by the library's parallel fill
    (`together`) or one after another: each step's seconds."""
    bitmask = torch.full((batch, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    matchers = [backend.matcher(compiled) for _ in range(batch)]
    for i, m in enumerate(matchers):
        for token in tokens[: i % len(tokens)]:
            backend.accept(m, token)
    positions = [i % len(tokens) for i in range(batch)]
    steps = []
    for _ in range(len(tokens)):
        start = time.perf_counter()
        if together:
            backend.fill_batch(matchers, bitmask)
        else:
            for row, m in enumerate(matchers):
                backend.fill(m, bitmask, row)
        steps.append(time.perf_counter() - start)
        for row, m in enumerate(matchers):
            backend.accept(m, tokens[positions[row]])
            positions[row] += 1
            if positions[row] == len(tokens):  # this row's instance is done: a new request
                matchers[row], positions[row] = backend.matcher(compiled), 0
    return steps


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default=".whl/qwen3-tokenizer", help="a Qwen tokenizer directory")
    ap.add_argument("--repeat", type=int, default=5, help="compiles timed per backend (median)")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    text = json.dumps(INSTANCE, separators=(",", ":"))
    schema_tokens = tokenizer.encode(text, add_special_tokens=False)
    regex_tokens = tokenizer.encode(REGEX_TEXT, add_special_tokens=False)
    print(f"torch threads {torch.get_num_threads()}; vocab {VOCAB}; instance {len(schema_tokens)} tokens")
    bitmask = torch.full((1, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    us = 1e6
    for cls in (Xgrammar, Llguidance):
        b = cls(tokenizer)
        compile_s, compiled = timed(b.compile_schema, args.repeat)
        regex_s, regex = timed(b.compile_regex, args.repeat)
        print(f"{b.name}: tokenizer setup {b.setup_s * 1e3:.0f} ms; compile (median of {args.repeat}): "
              f"schema {compile_s * 1e3:.1f} ms, regex {regex_s * 1e3:.1f} ms")
        for what, grammar, tokens in (("schema", compiled, schema_tokens), ("regex", regex, regex_tokens)):
            walks = [walk(b, grammar, tokens, bitmask) for _ in range(args.repeat)]
            warm = [t for w in walks[1:] for t in w]  # the first walk pays lazily built tables
            print(f"  fill, {what}: first walk's first fill {walks[0][0] * us:.0f} us; later walks "
                  f"mean {statistics.mean(warm) * us:.0f} us, median {statistics.median(warm) * us:.0f} us, "
                  f"p99 {pct(warm, 0.99) * us:.0f} us ({len(tokens)} tokens)")
        for together in (True, False):
            steps = batch_steps(b, compiled, schema_tokens, args.batch, together)
            how = "parallel fill" if together else "one by one"
            print(f"  batch {args.batch}, {how}: step mean {statistics.mean(steps) * 1e3:.2f} ms, "
                  f"median {statistics.median(steps) * 1e3:.2f} ms, p99 {pct(steps, 0.99) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
