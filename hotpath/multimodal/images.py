"""Image pixels for the Qwen vision towers, equal to transformers' Qwen2VLImageProcessorPil (the
image processor Qwen3-VL and Qwen3.5 use): RGB, smart resize (PIL bicubic), the tower's patch
order; the rows stay uint8 beside a table of each value's rescaled, normalised float32, which the
runner applies on the device (hotpath/multimodal/inputs.py: normalise_pixels)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from PIL import Image

from hotpath.multimodal.config import PixelConfig

MAX_ASPECT_RATIO = 200  # the Qwen processors' limit


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled so the area lies in
    [min_pixels, max_pixels], keeping the aspect ratio as near as the rounding allows."""
    _check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _check_aspect_ratio(height: int, width: int) -> None:
    if min(height, width) < 1:
        raise ValueError(f"an image needs at least one pixel per side, got {height}x{width}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image aspect ratio {max(height, width) / min(height, width):.1f} is over the limit "
                         f"of {MAX_ASPECT_RATIO} ({height}x{width})")


def to_rgb_array(image: Image.Image | np.ndarray | torch.Tensor) -> np.ndarray:
    """[H, W, 3] uint8 RGB; transparency is composited onto white as transformers does.
    Arrays and tensors: uint8, HxW (greyscale), HxWxC or CxHxW with C in 1, 3, 4 (channels first
    where both ends could be channels, as transformers guesses)."""
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        return np.array(image.convert("RGB"))
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):  # a ValueError, as all bad request input (HTTP 400)
        raise ValueError(  # noqa: TRY004
            "an image must be a PIL image, a numpy array, a torch tensor, a URL, a path or encoded bytes; "
            f"got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ValueError(f"image arrays must be uint8 (0..255), got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    elif image.ndim == 3 and image.shape[0] in (1, 3, 4):
        image = np.moveaxis(image, 0, -1)
    elif image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"an image array must be HxW, HxWxC or CxHxW with C in (1, 3, 4), got shape {image.shape}")
    channels = image.shape[-1]
    if channels == 1:
        return np.repeat(image, 3, axis=-1)
    if channels == 4:
        alpha = image[..., 3:4] / 255
        return np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return np.ascontiguousarray(image)


def preprocess_image(rgb: np.ndarray, config: PixelConfig, min_pixels: int, max_pixels: int
                     ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int], np.ndarray]:
    """(uint8 pixel rows [h*w, 3, 1, P*P], their [3, 256] normalisation table, grid (t, h, w), the
    resized [h, w, 3] uint8 image the rows are made from) for an [H, W, 3] uint8 image: one frame,
    which the runner repeats to fill the tower's temporal patch (normalise_pixels)."""
    height, width = rgb.shape[:2]
    new_h, new_w = smart_resize(height, width, config.factor, min_pixels, max_pixels)
    resized = np.asarray(Image.fromarray(rgb).resize((new_w, new_h), resample=Image.Resampling.BICUBIC))
    lut = torch.from_numpy(_normalised_values(config.rescale_factor, config.image_mean, config.image_std))
    frame = torch.from_numpy(np.ascontiguousarray(resized.transpose(2, 0, 1)))  # [3, new_h, new_w]
    rows = patchify(frame.unsqueeze(0), config, temporal=1)
    return rows, lut, (1, new_h // config.patch_size, new_w // config.patch_size), resized


@functools.lru_cache(maxsize=8)
def _normalised_values(rescale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """[3, 256] float32: each channel's normalised value of every uint8, computed as transformers
    does (rescaled in float64, cast to float32, normalised in float32), so a lookup gives the same
    bits as the arithmetic on the whole image."""
    scaled = (np.arange(256, dtype=np.float64) * rescale).astype(np.float32)
    return (scaled[None, :] - np.asarray(mean, np.float32)[:, None]) / np.asarray(std, np.float32)[:, None]


def patchify(frames: torch.Tensor, config: PixelConfig, temporal: int | None = None) -> torch.Tensor:
    """[T, C, H, W] (T a multiple of `temporal`, the temporal patch by default) -> [t*h*w, C,
    temporal, patch*patch]: patches ordered so that each merge x merge block of neighbours is
    consecutive, as the tower's merger reads them."""
    num_frames, channels, height, width = frames.shape
    p, m = config.patch_size, config.merge_size
    tp = config.temporal_patch_size if temporal is None else temporal
    assert num_frames % tp == 0 and height % (p * m) == 0 and width % (p * m) == 0, frames.shape
    t, h, w = num_frames // tp, height // p, width // p
    patches = frames.reshape(t, tp, channels, h // m, m, p, w // m, m, p)
    # [t, h/m, w/m, m, m, C, tp, p, p]
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(t * h * w, channels, tp, p * p).contiguous()
