"""hotpath: a small, fast inference engine for Qwen-family and Llama-architecture models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hotpath.outputs import CompletionOutput, Logprob, RequestOutput
from hotpath.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hotpath.llm import LLM

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # LLM is imported on first use: it brings torch and the engine (seconds), which the `hotpath`
    # command's parser (--help) and its light subcommands never need
    if name == "LLM":
        from hotpath.llm import LLM

        return LLM
    raise AttributeError(f"module 'hotpath' has no attribute {name!r}")
