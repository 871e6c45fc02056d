"""hotpath: a small, fast inference engine for Qwen-family and Llama-architecture models."""

from hotpath.llm import LLM
from hotpath.outputs import CompletionOutput, Logprob, RequestOutput
from hotpath.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"
