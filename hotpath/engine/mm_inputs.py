"""Images and videos in prompts: the engine's checks and the preprocessing of a prompt dict's
`multi_modal_data` (vLLM's shape: {"image": one or a list, "video": one or a list}).

The offline engine preprocesses in its own process; the server does it in its front end, off the
engine's loop, and sends the ProcessedPrompt on (the engine then checks only the limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hotpath.args import EngineArgs, json_object
from hotpath.config import ModelConfig, MultiModalConfig
from hotpath.multimodal.inputs import MultiModalItem, ProcessedPrompt
from hotpath.multimodal.media import MediaPolicy
from hotpath.multimodal.processor import MODALITIES, MultiModalProcessor, media_lists

# the most items of each kind one prompt may carry where --limit-mm-per-prompt does not say
DEFAULT_LIMITS = {"image": 16, "video": 2}


def _json_arg(name: str, value: dict | str | None) -> dict[str, Any]:
    return {} if value is None else json_object(name, value)


def parse_limits(value: dict | str | None) -> dict[str, int]:
    limits = _json_arg("limit_mm_per_prompt", value)
    bad = [k for k in limits if k not in MODALITIES]
    if bad:
        raise ValueError(f"limit_mm_per_prompt names {bad}; it takes {', '.join(MODALITIES)}")
    for k, v in limits.items():
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"limit_mm_per_prompt[{k!r}] must be a non-negative integer, got {v!r}")
    return {**DEFAULT_LIMITS, **limits}


class MultiModalInputs:
    def __init__(self, model_config: ModelConfig, model_dir: Path, tokenizer, args: EngineArgs) -> None:
        self.model_config = model_config
        self.model_dir = model_dir
        self.tokenizer = tokenizer
        self.language_model_only = args.language_model_only
        self.limits = parse_limits(args.limit_mm_per_prompt)
        self.processor_kwargs = _json_arg("mm_processor_kwargs", args.mm_processor_kwargs)
        self.media_policy = MediaPolicy(allowed_local_media_path=args.allowed_local_media_path,
                                        allowed_media_domains=args.allowed_media_domains)
        self._processor = None

    def _require_multimodal(self) -> MultiModalConfig:
        mm = self.model_config.multimodal
        if mm is None:
            why = " (it was loaded with language_model_only)" if self.language_model_only else ""
            raise ValueError(f"{self.model_config.architecture} takes no images or videos{why}; "
                             "send text only")
        return mm

    @property
    def processor(self) -> MultiModalProcessor:
        """The model's image and video processor (built on first use)."""
        if self._processor is None:
            mm = self._require_multimodal()
            ids = {f"{key}_token_id": getattr(mm, f"{key}_token_id")
                   for key in ("image", "video", "vision_start", "vision_end")}
            self._processor = MultiModalProcessor.from_model_dir(self.model_dir, ids, self.tokenizer,
                                                                 self.media_policy)
        return self._processor

    def process(self, prompt: dict[str, Any]) -> ProcessedPrompt:
        """A prompt dict with `multi_modal_data`, as token ids with its items preprocessed."""
        data = prompt["multi_modal_data"]
        if not isinstance(data, dict):
            raise ValueError("multi_modal_data must be a dict: {\"image\": ..., \"video\": ...}")
        processor = self.processor
        images, videos = media_lists(data)
        self._check_counts({"image": len(images), "video": len(videos)})
        text = prompt.get("prompt")
        source = prompt.get("prompt_token_ids", text)
        if source is None:
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        kwargs = {**self.processor_kwargs, **_json_arg("mm_processor_kwargs", prompt.get("mm_processor_kwargs"))}
        processed = processor.process(source, data, kwargs or None)
        if not processed.prompt_token_ids:
            raise ValueError("the prompt is empty")
        return processed

    def check_items(self, items: list[MultiModalItem]) -> None:
        """A preprocessed prompt's items: this model takes them, within the limits."""
        self._require_multimodal()
        counts = {m: sum(1 for item in items if item.modality == m) for m in MODALITIES}
        self._check_counts(counts)

    def _check_counts(self, counts: dict[str, int]) -> None:
        for modality, n in counts.items():
            if n > self.limits[modality]:
                raise ValueError(f"the prompt has {n} {modality}s; at most {self.limits[modality]} "
                                 f"are allowed (--limit-mm-per-prompt)")
