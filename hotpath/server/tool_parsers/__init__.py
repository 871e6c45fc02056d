"""Tool calls out of model text: `--tool-call-parser` names (vLLM's) -> parser classes; base.py
holds the interface."""

from hotpath.server.tool_parsers.base import ParsedDelta, ToolCallDelta, ToolParser
from hotpath.server.tool_parsers.hermes import HermesToolParser
from hotpath.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "qwen3_coder": Qwen3CoderToolParser}

__all__ = ["TOOL_PARSERS", "ParsedDelta", "ToolCallDelta", "ToolParser"]
