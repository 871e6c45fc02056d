"""Per-request sampling settings, named and defaulted like vLLM's SamplingParams (and its
StructuredOutputsParams: the constraint a request's output must follow)."""

import json as _json
from dataclasses import dataclass, fields

# Temperatures below this are treated as greedy, as in vLLM: dividing logits by them would overflow.
GREEDY_TEMPERATURE_EPS = 1e-5

MAX_LOGPROBS = 20


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    """The one constraint a request's output follows, as vLLM names them: `json` (a JSON schema,
    as a dict or its JSON text), `regex`, `choice` (the output is one of these strings),
    `grammar` (Lark, or GBNF / EBNF with `::=` rules), `json_object` (any JSON object). Exactly
    one is set. Whether it compiles is checked when the request is added (hotpath/structured)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        chosen = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError(f"structured_outputs must set exactly one of {', '.join(STRUCTURED_KINDS)}; "
                             f"got {', '.join(chosen) if chosen else 'none'}")
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = _json.loads(schema)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            if not isinstance(schema, dict):
                raise ValueError("structured_outputs.json must be a JSON schema object (a dict or its "
                                 f"JSON text), got {type(schema).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)) or not self.choice:
                raise ValueError(f"structured_outputs.choice must be a non-empty list of strings, got {self.choice!r}")
            if not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must hold only non-empty strings, "
                                 f"got {self.choice!r}")
            self.choice = list(self.choice)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")

    @property
    def kind(self) -> str:
        """Which constraint is set: one of STRUCTURED_KINDS."""
        return next(name for name in STRUCTURED_KINDS if getattr(self, name) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as one string, so equal constraints share a compiled grammar (a schema
        as compact JSON text, its keys in their order: properties are generated in that order)."""
        value = getattr(self, self.kind)
        if self.kind == "json":
            return _json.dumps(_json.loads(value) if isinstance(value, str) else value)
        if self.kind == "choice":
            return _json.dumps(value)
        if self.kind == "json_object":
            return ""
        return value


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled (normalized to 0)
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None  # normalized to list[str]
    stop_token_ids: list[int] | None = None  # normalized to list[int]
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context limit
    min_tokens: int = 0
    logprobs: int | None = None  # number of top logprobs to return besides the sampled token's
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # the output follows a JSON schema, regex, choice or grammar (a dict of its fields is taken too)
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids is not None else []
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.structured_outputs, dict):
            unknown = set(self.structured_outputs) - set(STRUCTURED_KINDS)
            if unknown:
                raise ValueError(f"structured_outputs has no field {sorted(unknown)[0]!r} (its fields: "
                                 f"{', '.join(STRUCTURED_KINDS)})")
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be StructuredOutputsParams or a dict of its fields, "
                             f"got {type(self.structured_outputs).__name__}")
        self._validate()

    def _validate(self) -> None:
        # Comparisons are written so that NaN fails them too.
        if not self.n >= 1:
            _invalid("n", self.n, "must be >= 1")
        if not self.temperature >= 0:
            _invalid("temperature", self.temperature, "must be >= 0")
        if not 0 < self.top_p <= 1:
            _invalid("top_p", self.top_p, "must be in (0, 1]")
        if not (self.top_k == 0 or self.top_k >= 1):
            _invalid("top_k", self.top_k, "must be -1 or 0 (disabled) or >= 1")
        if not 0 <= self.min_p <= 1:
            _invalid("min_p", self.min_p, "must be in [0, 1]")
        if not -2 <= self.presence_penalty <= 2:
            _invalid("presence_penalty", self.presence_penalty, "must be in [-2, 2]")
        if not -2 <= self.frequency_penalty <= 2:
            _invalid("frequency_penalty", self.frequency_penalty, "must be in [-2, 2]")
        if not self.repetition_penalty > 0:
            _invalid("repetition_penalty", self.repetition_penalty, "must be > 0")
        if self.max_tokens is not None and not self.max_tokens >= 1:
            _invalid("max_tokens", self.max_tokens, "must be >= 1 or None")
        if not self.min_tokens >= 0:
            _invalid("min_tokens", self.min_tokens, "must be >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _invalid("min_tokens", self.min_tokens, f"must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            _invalid("logprobs", self.logprobs, f"must be in [0, {MAX_LOGPROBS}] or None")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            _invalid("stop", self.stop, "must hold only non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            _invalid("stop_token_ids", self.stop_token_ids, "must hold only token ids >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _invalid(name: str, value: object, allowed: str) -> None:
    raise ValueError(f"{name} {allowed}, got {value!r}")
