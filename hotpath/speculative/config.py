"""SpeculativeConfig: which drafter proposes tokens and how many, shaped like vLLM's
`speculative_config` dict (the same keys, also accepted as JSON by the CLI's
--speculative-config).

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"method": "draft_model", "model": "qwen2.5-coder-0.5b", "num_speculative_tokens": 4}
    {"method": "mtp", "num_speculative_tokens": 2}   (the checkpoint's own mtp.* head: Qwen3-Next, Qwen3.5)

Kept free of torch: the CLI's --help reads this module.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hotpath.args import json_object

METHODS = ("ngram", "draft_model", "mtp")
# up to 7 drafts a verify row (the last token and its drafts) is a few-query row of the decode
# attention kernel (ops.attention.DECODE_MAX_QUERY_LEN = 8); longer ones run the prefill kernel
MAX_SPECULATIVE_TOKENS = 15


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # draft_model: the drafter (an asset name, HF directory or .gguf)
    prompt_lookup_min: int = 1  # ngram: the shortest suffix looked up in the context
    prompt_lookup_max: int = 4  # ngram: the longest
    # choose each step's number of drafts (0..num_speculative_tokens) from measured acceptance
    # and step times (speculative/policy.py); False: always num_speculative_tokens
    adaptive: bool = True

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """A dict (LLM(speculative_config=...)) or its JSON text (the CLI); None: no speculation.
        Raises ValueError naming the bad key or value."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        value = json_object("speculative config", value)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative config keys {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError(f"speculative config needs 'method' (one of {', '.join(METHODS)})")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative config needs 'num_speculative_tokens'")
        cfg = cls(**value)
        cfg._validate()
        return cfg

    def _validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative method 'draft_model' needs 'model' (the draft model)")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(f"prompt_lookup_min / prompt_lookup_max must be integers with "
                                 f"1 <= min <= max, got {lo!r} / {hi!r}")
