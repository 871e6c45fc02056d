"""The preprocessing settings of an image-text checkpoint, found where transformers looks for them:
processor_config.json's "image_processor" / "video_processor" sections (what transformers 5
writes), else preprocessor_config.json (images) and video_preprocessor_config.json (video, falling
back to preprocessor_config.json); with the defaults transformers uses for Qwen3-VL where a file
or key is absent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Qwen3-VL's released preprocessor_config.json: transformers' image processor class defaults are
# Qwen2-VL's (patch 14, CLIP mean / std), which a Qwen3-VL tower does not take
_IMAGE_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}
# transformers' Qwen3VLVideoProcessor class defaults
_VIDEO_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "fps": 2, "min_frames": 4, "max_frames": 768, "cap_pixels_per_frame": False, "max_video_tokens": 768,
}
_BICUBIC = 3  # PIL's Resampling.BICUBIC, the Qwen processors' resample


@dataclass(frozen=True)
class PixelConfig:
    patch_size: int
    temporal_patch_size: int
    merge_size: int  # merge x merge patches become one token
    min_pixels: int  # the processors' size["shortest_edge"], a pixel count despite the name
    max_pixels: int  # size["longest_edge"]
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merged token's side in pixels."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class VideoConfig:
    pixels: PixelConfig  # min / max_pixels bound frames x height x width of the whole clip
    fps: float  # frames sampled per second of video
    min_frames: int
    max_frames: int
    # qwen-vl-utils' per-frame pixel cap (transformers' cap_pixels_per_frame, off by default there)
    cap_pixels_per_frame: bool
    max_video_tokens: int  # per frame, under the cap


def read_preprocess_configs(model_dir: Path, hf_config: dict[str, Any]) -> tuple[PixelConfig, VideoConfig]:
    vision = hf_config.get("vision_config") or {}
    # the tower's own sizes where a preprocessor file does not say
    tower = {"patch_size": vision.get("patch_size", 16),
             "temporal_patch_size": vision.get("temporal_patch_size", 2),
             "merge_size": vision.get("spatial_merge_size", 2)}
    nested = _read_json(model_dir / "processor_config.json")
    image_file = _read_json(model_dir / "preprocessor_config.json")
    video_file = _read_json(model_dir / "video_preprocessor_config.json") or image_file
    image = {**_IMAGE_DEFAULTS, **tower, **(nested.get("image_processor") or image_file)}
    video = {**_VIDEO_DEFAULTS, **tower, **(nested.get("video_processor") or video_file)}
    video_config = VideoConfig(
        pixels=_pixel_config(video, "video_preprocessor_config.json"),
        fps=float(video["fps"]),
        min_frames=int(video["min_frames"]),
        max_frames=int(video["max_frames"]),
        cap_pixels_per_frame=bool(video["cap_pixels_per_frame"]),
        max_video_tokens=int(video["max_video_tokens"]),
    )
    if not (video_config.fps > 0 and 1 <= video_config.min_frames <= video_config.max_frames):
        raise ValueError(f"video_preprocessor_config.json: need fps > 0 and 1 <= min_frames <= max_frames, got "
                         f"fps={video_config.fps}, min_frames={video_config.min_frames}, "
                         f"max_frames={video_config.max_frames}")
    return _pixel_config(image, "preprocessor_config.json"), video_config


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _pixel_config(cfg: dict[str, Any], name: str) -> PixelConfig:
    for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if cfg.get(flag) is False:
            raise ValueError(f"{name} sets {flag}=false, which hotpath does not support")
    if cfg.get("resample", _BICUBIC) != _BICUBIC:
        raise ValueError(f"{name} sets resample={cfg['resample']}; hotpath supports only bicubic ({_BICUBIC})")
    size = dict(cfg.get("size") or {})
    # older (Qwen2-VL) files give min_pixels / max_pixels; transformers lets them override size
    min_pixels = cfg.get("min_pixels") or size.get("shortest_edge")
    max_pixels = cfg.get("max_pixels") or size.get("longest_edge")
    if not min_pixels or not max_pixels:
        raise ValueError(f"{name}: size needs 'shortest_edge' and 'longest_edge', got {size}")
    config = PixelConfig(
        patch_size=int(cfg["patch_size"]),
        temporal_patch_size=int(cfg["temporal_patch_size"]),
        merge_size=int(cfg["merge_size"]),
        min_pixels=int(min_pixels),
        max_pixels=int(max_pixels),
        image_mean=_triple(cfg["image_mean"], "image_mean", name),
        image_std=_triple(cfg["image_std"], "image_std", name),
        rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
    )
    sizes = (config.patch_size, config.temporal_patch_size, config.merge_size)
    if min(sizes) < 1 or config.min_pixels > config.max_pixels:
        raise ValueError(f"{name}: bad patch sizes or min_pixels > max_pixels in {config}")
    return config


def _triple(value: Any, key: str, name: str) -> tuple[float, float, float]:
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"{name}: {key} needs 3 values (one per RGB channel), got {value}")
    return values[0], values[1], values[2]
