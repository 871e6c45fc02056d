"""Video for the Qwen vision towers, equal to transformers' Qwen3VLVideoProcessor run on the CPU:
frames sampled at `fps`, resized (bicubic with antialias on uint8, as torchvision does on the CPU),
padded to the temporal patch, kept uint8 beside the table of their normalised values; and the
frame timestamps that Qwen3VLProcessor writes into the prompt. Files are decoded with PyAV, frame by frame, each sampled
frame resized as it comes so a long video never sits in memory at full size."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hotpath.multimodal.config import VideoConfig
from hotpath.multimodal.images import MAX_ASPECT_RATIO, patchify
from hotpath.multimodal.media import MediaError, MediaPolicy

# transformers' assumption for frames passed without their video's frame rate
DEFAULT_SOURCE_FPS = 24.0
# FFmpeg demuxers a client's file may use (mp4 / mov, mkv / webm, ...): some others open further
# files or URLs that the file names, and no input may make the server read or fetch those
_DEMUXERS = "mov,matroska,avi,mpegts,flv,ogg,mpeg,gif"
_FFMPEG_OPTIONS = {"format_whitelist": _DEMUXERS, "protocol_whitelist": ""}


@dataclass
class Video:
    pixels: torch.Tensor  # [t*h*w, 3, temporal_patch, patch*patch] uint8
    pixel_lut: torch.Tensor  # [3, 256] float32: each channel's normalised value of every uint8
    grid_thw: tuple[int, int, int]
    timestamps: list[float]  # seconds, one per temporal grid step


def sample_frame_indices(total_frames: int, source_fps: float, fps: float, config: VideoConfig) -> list[int]:
    """`fps` frames per second of video, at least min_frames and at most max_frames (and never more
    than the video has), spread evenly from the first frame to the last."""
    num_frames = int(total_frames / source_fps * fps)
    num_frames = min(max(num_frames, config.min_frames), config.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, num_frames).round().astype(int).tolist()


def frame_timestamps(indices: list[int], source_fps: float, temporal_patch_size: int) -> list[float]:
    """One time per temporal grid step: the mean of its first and last frame's times (the last
    frame repeated to fill the final step, as the pixels are)."""
    padded = indices + [indices[-1]] * (-len(indices) % temporal_patch_size)
    times = [i / source_fps for i in padded]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def smart_resize_video(num_frames: int, height: int, width: int, config: VideoConfig) -> tuple[int, int]:
    """The frame size for a clip of `num_frames` sampled frames: sides multiples of the merged patch,
    frames x height x width within the config's pixel budget."""
    pixels = config.pixels
    factor, temporal = pixels.factor, pixels.temporal_patch_size
    if num_frames < temporal:
        raise ValueError(f"a video needs at least {temporal} frames (the temporal patch), got {num_frames}")
    max_pixels = pixels.max_pixels
    if config.cap_pixels_per_frame:
        per_frame = max(min(config.max_video_tokens * factor * factor, pixels.max_pixels // num_frames),
                        int(pixels.min_pixels * 1.05))
        max_pixels = per_frame * num_frames
    if height < factor or width < factor:  # tiny frames are first scaled up to one merged patch
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"video aspect ratio {max(height, width) / min(height, width):.1f} is over the limit "
                         f"of {MAX_ASPECT_RATIO} ({height}x{width})")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < pixels.min_pixels:
        beta = math.sqrt(pixels.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess_frames(frames: list[np.ndarray], fps: float, config: VideoConfig) -> Video:
    """A video given as decoded [H, W, 3] uint8 RGB frames of unknown frame rate: sampled as
    transformers samples them, taking DEFAULT_SOURCE_FPS as the rate."""
    indices = sample_frame_indices(len(frames), DEFAULT_SOURCE_FPS, fps, config)
    resized = _resize_frames((frames[i] for i in indices), len(indices), config)
    return _to_video(resized, indices, DEFAULT_SOURCE_FPS, config)


def decode_video(data: bytes, fps: float, config: VideoConfig, policy: MediaPolicy) -> Video:
    """A video file's bytes decoded with PyAV; MediaError for what is not a decodable video."""
    try:
        import av
    except ImportError as e:
        raise ValueError("decoding video files needs PyAV: pip install av (or pass the frames)") from e
    try:
        with av.open(io.BytesIO(data), options=_FFMPEG_OPTIONS) as container:
            if not container.streams.video:
                raise MediaError("the file has no video stream")
            stream = container.streams.video[0]
            if stream.width * stream.height > policy.max_pixels:
                raise MediaError(f"video frames are {stream.width}x{stream.height}, over the limit of "
                                 f"{policy.max_pixels} pixels (max_pixels)")
            source_fps = float(stream.average_rate or 0) or DEFAULT_SOURCE_FPS
            total = stream.frames or sum(1 for _ in container.decode(stream))
            if total < 1:
                raise MediaError("the video has no frames")
            indices = sample_frame_indices(total, source_fps, fps, config)
            container.seek(0)
            frames = _decoded_frames(container.decode(stream), indices, policy.max_pixels)
            resized = _resize_frames(frames, len(indices), config)
    except av.error.FFmpegError as e:
        raise MediaError(f"cannot decode the video (containers: {_DEMUXERS}): {e}") from e
    # a header may promise more frames than the stream holds; keep the ones that came
    return _to_video(resized, indices[: len(resized)], source_fps, config)


def _decoded_frames(decoded: Iterable, indices: list[int], max_pixels: int) -> Iterator[np.ndarray]:
    wanted = set(indices)
    for i, frame in enumerate(decoded):
        if i > indices[-1]:
            return
        if i in wanted:
            # the stream header is the client's word; the decoded frame is what memory pays for
            if frame.width * frame.height > max_pixels:
                raise MediaError(f"a video frame is {frame.width}x{frame.height}, over the limit of "
                                 f"{max_pixels} pixels (max_pixels)")
            yield frame.to_ndarray(format="rgb24")


def _resize_frames(frames: Iterable[np.ndarray], num_frames: int, config: VideoConfig) -> torch.Tensor:
    """[num_frames, 3, h, w] uint8, each frame resized as it arrives."""
    resized: list[torch.Tensor] = []
    size = target = None
    for rgb in frames:
        if size is None:
            size = rgb.shape[:2]
            target = smart_resize_video(num_frames, size[0], size[1], config)
        elif rgb.shape[:2] != size:
            raise ValueError(f"all frames of a video must have one size; got {size} and {rgb.shape[:2]}")
        frame = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).unsqueeze(0).contiguous()
        if target != tuple(size):
            frame = F.interpolate(frame, size=target, mode="bicubic", align_corners=False, antialias=True)
        resized.append(frame[0])
    if not resized:
        raise MediaError("the video has no frames")
    return torch.stack(resized)


def _to_video(resized: torch.Tensor, indices: list[int], source_fps: float, config: VideoConfig) -> Video:
    pixels = config.pixels
    temporal = pixels.temporal_patch_size
    if resized.shape[0] < temporal:
        raise ValueError(f"a video needs at least {temporal} frames (the temporal patch), got {resized.shape[0]}")
    # transformers folds the rescale into the mean and std, (x - 255 mean) / (255 std) in float32:
    # the same arithmetic on every uint8 value once
    mean = torch.tensor(pixels.image_mean) * (1.0 / pixels.rescale_factor)
    std = torch.tensor(pixels.image_std) * (1.0 / pixels.rescale_factor)
    lut = (torch.arange(256, dtype=torch.float32) - mean.view(-1, 1)) / std.view(-1, 1)  # [3, 256]
    frames = resized  # [T, 3, h, w] uint8
    if pad := -frames.shape[0] % temporal:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    _, _, height, width = frames.shape
    grid = (frames.shape[0] // temporal, height // pixels.patch_size, width // pixels.patch_size)
    return Video(patchify(frames, pixels), lut, grid, frame_timestamps(indices, source_fps, temporal))
