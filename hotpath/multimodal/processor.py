"""A prompt with images and videos turned into what the engine runs: placeholder tokens expanded
and media preprocessed, equal to transformers' Qwen3VLProcessor (input_ids, pixel_values,
image_grid_thw, pixel_values_videos, video_grid_thw).

The prompt holds one <|image_pad|> per image and one <|video_pad|> per video, in the order of
mm_data's lists, as the Qwen chat templates write them (<|vision_start|><|image_pad|><|vision_end|>).
An image's pad becomes one pad per merged patch. A video's <|vision_start|><|video_pad|><|vision_end|>
(or a bare <|video_pad|>) becomes, per temporal grid step, "<{t:.1f} seconds>" and that step's
pads between their own <|vision_start|> and <|vision_end|>.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from hotpath.multimodal.config import PixelConfig, VideoConfig, read_preprocess_configs
from hotpath.multimodal.images import preprocess_image, to_rgb_array
from hotpath.multimodal.inputs import MultiModalItem, ProcessedPrompt
from hotpath.multimodal.media import MediaPolicy, load_bytes, load_image
from hotpath.multimodal.videos import Video, decode_video, preprocess_frames

MODALITIES = ("image", "video")
PROCESSOR_KWARGS = ("min_pixels", "max_pixels", "fps")


@dataclass(frozen=True)
class PlaceholderTokens:
    image: int  # <|image_pad|>
    video: int  # <|video_pad|>
    vision_start: int
    vision_end: int


@dataclass
class _Settings:
    """One request's preprocessing settings: the checkpoint's, narrowed by mm_processor_kwargs."""

    min_pixels: int  # per image
    max_pixels: int
    fps: float


class MultiModalProcessor:
    """Stateless after construction: one instance serves every request (media loads under its policy)."""

    def __init__(self, image_config: PixelConfig, video_config: VideoConfig, tokens: PlaceholderTokens,
                 tokenizer: Any, media_policy: MediaPolicy | None = None) -> None:
        self.image_config = image_config
        self.video_config = video_config
        self.tokens = tokens
        self.tokenizer = tokenizer  # an HF tokenizer; None: token-id prompts with images only
        self.media_policy = media_policy or MediaPolicy()
        # the placeholders as text, to expand text prompts before tokenizing as transformers does
        self._strings = (None if tokenizer is None else
                         dict(zip(("image", "video", "start", "end"), tokenizer.convert_ids_to_tokens(
                             [tokens.image, tokens.video, tokens.vision_start, tokens.vision_end]))))

    @classmethod
    def from_model_dir(cls, model_dir: Path, hf_config: dict[str, Any], tokenizer: Any,
                       media_policy: MediaPolicy | None = None) -> MultiModalProcessor:
        image_config, video_config = read_preprocess_configs(Path(model_dir), hf_config)
        ids = {}
        for key, text in (("image", "<|image_pad|>"), ("video", "<|video_pad|>"),
                          ("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>")):
            token_id = hf_config.get(f"{key}_token_id")
            if token_id is None and tokenizer is not None:
                token_id = tokenizer.convert_tokens_to_ids(text)
                token_id = None if token_id == tokenizer.unk_token_id else token_id
            if token_id is None:
                raise ValueError(f"config.json has no {key}_token_id and the tokenizer has no {text} token")
            ids[key] = token_id
        return cls(image_config, video_config, PlaceholderTokens(**ids), tokenizer, media_policy)

    def process(self, prompt: str | list[int], mm_data: dict[str, Any],
                mm_processor_kwargs: dict[str, Any] | None = None) -> ProcessedPrompt:
        images, videos = media_lists(mm_data)
        settings = self._settings(mm_processor_kwargs or {})
        text = prompt if isinstance(prompt, str) else None
        if text is not None and self._strings is None:
            raise ValueError("text prompts need a tokenizer; pass prompt token ids")
        self._check_placeholder_counts(prompt, len(images), len(videos))

        image_rows = [self._image(image, settings) for image in images]
        video_rows = [self._video(video, settings) for video in videos]
        merge = self.image_config.merge_size ** 2
        image_tokens = [math.prod(grid) // merge for _, _, grid, _ in image_rows]
        frame_tokens = [video.grid_thw[1] * video.grid_thw[2] // self.video_config.pixels.merge_size ** 2
                        for video in video_rows]
        if text is not None:
            token_ids = self.tokenizer.encode(self._expand_text(text, image_tokens, video_rows, frame_tokens),
                                              add_special_tokens=True)
        else:
            token_ids = self._expand_ids(list(prompt), image_tokens, video_rows, frame_tokens)

        image_spans = _placeholder_spans(token_ids, self.tokens.image, image_tokens, "<|image_pad|>")
        video_spans = _placeholder_spans(token_ids, self.tokens.video,
                                         [n * v.grid_thw[0] for n, v in zip(frame_tokens, video_rows)],
                                         "<|video_pad|>")
        items = [_item("image", spans, grid, rows, lut, self.image_config.temporal_patch_size, resized)
                 for spans, (rows, lut, grid, resized) in zip(image_spans, image_rows)]
        items += [_item("video", spans, v.grid_thw, v.pixels, v.pixel_lut, v.pixels.shape[2])
                  for spans, v in zip(video_spans, video_rows)]
        items.sort(key=lambda item: item.spans[0][0])
        return ProcessedPrompt(prompt=text, prompt_token_ids=token_ids, mm_items=items)

    def _settings(self, kwargs: dict[str, Any]) -> _Settings:
        unknown = sorted(set(kwargs) - set(PROCESSOR_KWARGS))
        if unknown:
            raise ValueError(f"unknown mm_processor_kwargs {unknown}; supported: {list(PROCESSOR_KWARGS)}")
        limit = self.image_config.max_pixels
        max_pixels = kwargs.get("max_pixels", limit)
        _check_positive_int("max_pixels", max_pixels)
        # a max_pixels under the checkpoint's min_pixels alone lowers both
        min_pixels = kwargs.get("min_pixels", min(self.image_config.min_pixels, max_pixels))
        _check_positive_int("min_pixels", min_pixels)
        if max_pixels > limit:
            raise ValueError(f"max_pixels {max_pixels} is over the model's limit of {limit}")
        if min_pixels > max_pixels:
            raise ValueError(f"min_pixels {min_pixels} is over max_pixels {max_pixels}")
        fps = kwargs.get("fps", self.video_config.fps)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (0 < fps < math.inf):
            raise ValueError(f"fps must be a positive number, got {fps!r}")
        return _Settings(min_pixels=min_pixels, max_pixels=max_pixels, fps=float(fps))

    def _check_placeholder_counts(self, prompt: str | list[int], num_images: int, num_videos: int) -> None:
        if isinstance(prompt, str):
            found = {"image": prompt.count(self._strings["image"]), "video": prompt.count(self._strings["video"])}
        else:
            found = {"image": prompt.count(self.tokens.image), "video": prompt.count(self.tokens.video)}
        for name, num_items in (("image", num_images), ("video", num_videos)):
            if found[name] != num_items:
                raise ValueError(f"the prompt has {found[name]} <|{name}_pad|> placeholder(s) but {num_items} "
                                 f"{name}(s) were given; write one placeholder per {name}")

    def _image(self, image: Any, settings: _Settings) -> tuple[torch.Tensor, tuple[int, int, int], np.ndarray]:
        if isinstance(image, (str, bytes)):
            image = load_image(image, self.media_policy)
        return preprocess_image(to_rgb_array(image), self.image_config, settings.min_pixels, settings.max_pixels)

    def _video(self, video: Any, settings: _Settings) -> Video:
        if isinstance(video, str):
            video = load_bytes(video, self.media_policy)
        if isinstance(video, bytes):
            return decode_video(video, settings.fps, self.video_config, self.media_policy)
        if isinstance(video, (np.ndarray, torch.Tensor)):
            if video.ndim != 4:
                raise ValueError(f"a video array must be [T, H, W, C] or [T, C, H, W], got {tuple(video.shape)}")
            video = list(video)
        if not isinstance(video, (list, tuple)) or not video:
            raise ValueError("a video is a list of frames, a [T, H, W, 3] array, a file's bytes, a URL or a path; "
                             f"got {type(video).__name__}")
        return preprocess_frames([to_rgb_array(frame) for frame in video], settings.fps, self.video_config)

    def _video_text(self, video: Video, frame_tokens: int) -> str:
        s = self._strings
        return "".join(f"<{t:.1f} seconds>{s['start']}{s['video'] * frame_tokens}{s['end']}"
                       for t in video.timestamps)

    def _expand_text(self, text: str, image_tokens: list[int], videos: list[Video], frame_tokens: list[int]) -> str:
        s = self._strings
        if videos:  # each frame carries its own start / end, so the template's pair around the video goes
            text = text.replace(s["start"] + s["video"] + s["end"], s["video"])
        images, video_texts = iter(image_tokens), iter(map(self._video_text, videos, frame_tokens))
        pieces = re.split(f"({re.escape(s['image'])}|{re.escape(s['video'])})", text)
        return "".join(s["image"] * next(images) if piece == s["image"] else
                       next(video_texts) if piece == s["video"] else piece for piece in pieces)

    def _expand_ids(self, ids: list[int], image_tokens: list[int], videos: list[Video],
                    frame_tokens: list[int]) -> list[int]:
        """The token-id prompt's placeholders expanded as _expand_text expands text; the timestamps
        are tokenized on their own, which equals tokenizing them in place wherever the text around
        them ends in a special token (as the chat template's <|vision_start|> does)."""
        if videos and self.tokenizer is None:
            raise ValueError("videos in a token-id prompt need the tokenizer (for the frame timestamps)")
        t = self.tokens
        images, videos_left = iter(image_tokens), iter(zip(videos, frame_tokens))
        out: list[int] = []
        i = 0
        while i < len(ids):
            token = ids[i]
            if token == t.image:
                out += [t.image] * next(images)
            elif token == t.video:
                video, per_frame = next(videos_left)
                if out and out[-1] == t.vision_start and i + 1 < len(ids) and ids[i + 1] == t.vision_end:
                    out.pop()
                    i += 1
                for time in video.timestamps:
                    out += self.tokenizer.encode(f"<{time:.1f} seconds>", add_special_tokens=False)
                    out += [t.vision_start] + [t.video] * per_frame + [t.vision_end]
            else:
                out.append(token)
            i += 1
        return out


def _check_positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")


def media_lists(mm_data: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """multi_modal_data's (images, videos), each a list of items."""
    unknown = sorted(set(mm_data) - set(MODALITIES))
    if unknown:
        raise ValueError(f"unknown multi_modal_data keys {unknown}; supported: {list(MODALITIES)}")
    images = mm_data.get("image")
    images = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    videos = mm_data.get("video")
    if videos is None:
        videos = []
    elif isinstance(videos, (list, tuple)):
        # a list of frames is one video; a list of anything else is a list of videos
        videos = [videos] if videos and all(map(_is_frame, videos)) else list(videos)
    else:
        videos = [videos]
    return images, videos


def _is_frame(x: Any) -> bool:
    return isinstance(x, Image.Image) or (isinstance(x, (np.ndarray, torch.Tensor)) and x.ndim in (2, 3))


def _placeholder_spans(token_ids: list[int], token_id: int, counts: list[int], name: str
                       ) -> list[list[tuple[int, int]]]:
    """Each item's runs of `token_id`, handing the placeholders out in order, counts[k] to item k."""
    positions = [pos for pos, token in enumerate(token_ids) if token == token_id]
    if len(positions) != sum(counts):
        raise ValueError(f"the tokenizer does not keep {name} as one token: the expanded prompt has "
                         f"{len(positions)} of them, the media need {sum(counts)}")
    spans: list[list[tuple[int, int]]] = []
    start = 0
    for count in counts:
        runs: list[tuple[int, int]] = []
        for pos in positions[start:start + count]:
            if runs and runs[-1][0] + runs[-1][1] == pos:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((pos, 1))
        spans.append(runs)
        start += count
    return spans


def _item(modality: str, spans: list[tuple[int, int]], grid: tuple[int, int, int], pixels: torch.Tensor,
          lut: torch.Tensor, temporal_patch: int, source: np.ndarray | None = None) -> MultiModalItem:
    """`source`: the uint8 pixels the rows were made from (an image's resized frame), hashed in
    their place: the same identity in fewer bytes (the rows repeat the frame)."""
    digest = hashlib.sha256(f"{modality}:{grid[0]},{grid[1]},{grid[2]}:".encode())
    digest.update(lut.numpy().tobytes())
    digest.update(np.ascontiguousarray(source).data if source is not None else pixels.contiguous().numpy().data)
    return MultiModalItem(modality=modality, spans=spans, grid_thw=grid, pixels=pixels, pixel_lut=lut,
                          content_hash=digest.hexdigest(), temporal_patch=temporal_patch)
