"""Prompts and the tokenizer: loading it, turning what a user passes into token ids, and the ids
that end a sequence."""

from __future__ import annotations

import json
from pathlib import Path

from hotpath.config import ModelConfig


def tokenize_prompt(tokenizer, vocab_size: int, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
    """(the prompt's text if it has one, its token ids) from text, token ids or a prompt dict;
    ValueError for what cannot be a prompt."""
    text = None
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:  # "prompt" may ride along as the text it came from
            text = prompt.get("prompt")
            prompt = list(prompt["prompt_token_ids"])
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer (skip_tokenizer_init is set); pass prompt_token_ids")
        token_ids = tokenizer.encode(prompt, add_special_tokens=True)
        text = prompt
    else:
        token_ids = list(prompt)
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}); got {bad[:5]}")
    if not token_ids:
        raise ValueError("the prompt is empty")
    return text, token_ids


def eos_token_ids(model_dir: Path, model_config: ModelConfig, tokenizer) -> set[int]:
    """EOS ids as HF generate uses them: generation_config.json first, then config.json."""
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            return set([eos] if isinstance(eos, int) else eos)
    if model_config.eos_token_id:
        return set(model_config.eos_token_id)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return {tokenizer.eos_token_id}
    return set()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load a tokenizer from {path}: {e}. Pass tokenizer=... or "
            "skip_tokenizer_init=True with token-id prompts"
        ) from e
