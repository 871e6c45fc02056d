"""MultiModalProcessor against transformers' own Qwen3-VL preprocessing: pixel rows and grids equal
to Qwen2VLImageProcessorPil (the image processor transformers picks without torchvision, which its
torchvision-backed Qwen2VLImageProcessor needs), input_ids equal to Qwen3VLProcessor's, video pixels
equal to Qwen3VLVideoProcessor's where torchvision is installed."""

from __future__ import annotations

import importlib
import io
import json
import math
import re

import numpy as np
import pytest
import torch
from PIL import Image

from hotpath.multimodal.media import MediaError, MediaPolicy
from hotpath.multimodal.processor import MultiModalProcessor

# Qwen3-VL's released preprocessor_config.json and video_preprocessor_config.json
IMAGE_CONFIG = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
VIDEO_CONFIG = {**IMAGE_CONFIG, "size": {"longest_edge": 25165824, "shortest_edge": 4096}}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
CORPUS = ["Describe the picture. What is in this image, and what changes in the video?",
          "<0.0 seconds><1.5 seconds><12.3 seconds> frames and pictures",
          "The quick brown fox jumps over the lazy dog."]
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE tokenizer with Qwen's vision special tokens, built in well under a second."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 10, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>", additional_special_tokens=SPECIAL[1:])


@pytest.fixture(scope="module")
def hf_config(tokenizer):
    ids = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
    return dict(zip(["image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"], ids))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3-vl-preprocessing")
    (out / "preprocessor_config.json").write_text(json.dumps(IMAGE_CONFIG))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_CONFIG))
    return out


@pytest.fixture(scope="module")
def processor(model_dir, hf_config, tokenizer):
    return MultiModalProcessor.from_model_dir(model_dir, hf_config, tokenizer)


def reference_image_processor(**size):
    from transformers import Qwen2VLImageProcessorPil

    config = {k: v for k, v in IMAGE_CONFIG.items() if k != "size"}
    return Qwen2VLImageProcessorPil(**config, size={**IMAGE_CONFIG["size"], **size})


def video_frames_reference():
    """Qwen3VLVideoProcessor needs torchvision. Where it is missing, this stands in for it inside
    Qwen3VLProcessor, which reads only the grid and the sampled frames' metadata: both come from
    transformers' own code (the processor class's sample_frames and its module's smart_resize)."""
    try:
        import torchvision  # noqa: F401
        from transformers import Qwen3VLVideoProcessor

        return Qwen3VLVideoProcessor(**VIDEO_CONFIG, cap_pixels_per_frame=False)
    except ImportError:
        pass
    # the module itself, not transformers' lazy stand-in, which refuses without torchvision
    module = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
    from transformers.feature_extraction_utils import BatchFeature
    from transformers.video_utils import VideoMetadata

    class VideoGridReference:
        patch_size, temporal_patch_size, merge_size = 16, 2, 2
        fps, min_frames, max_frames = 2, 4, 768

        def __call__(self, videos, **kwargs):
            grids, metadata = [], []
            for video in videos:
                meta = VideoMetadata(total_num_frames=len(video))
                meta.frames_indices = module.Qwen3VLVideoProcessor.sample_frames(self, meta)
                height, width = module.smart_resize(
                    len(meta.frames_indices), video.shape[1], video.shape[2], temporal_factor=2, factor=32,
                    min_pixels=VIDEO_CONFIG["size"]["shortest_edge"], max_pixels=VIDEO_CONFIG["size"]["longest_edge"])
                grids.append([math.ceil(len(meta.frames_indices) / 2), height // 16, width // 16])
                metadata.append(meta)
            return BatchFeature({"video_grid_thw": torch.tensor(grids), "video_metadata": metadata})

    return VideoGridReference()


@pytest.fixture(scope="module")
def qwen3vl_processor(tokenizer):
    from transformers import Qwen3VLProcessor

    video_processor = video_frames_reference()
    processor = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    if not hasattr(video_processor, "to_dict"):  # the stand-in: skip the class check on it alone
        check = Qwen3VLProcessor.check_argument_for_proper_class
        processor.check_argument_for_proper_class = lambda name, arg: (
            type(arg) if name == "video_processor" else check(processor, name, arg))
    processor.__init__(image_processor=reference_image_processor(), tokenizer=tokenizer,
                       video_processor=video_processor)
    return processor


def synthetic_photo(height: int, width: int) -> Image.Image:
    """Smooth gradients and hard edges, unlike noise: what bicubic resampling meets in photographs."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([255 * x / width, 255 * y / height, 128 + 127 * np.sin(x / 9.0) * np.cos(y / 13.0)], -1)
    rgb[(x - width / 2) ** 2 + (y - height / 3) ** 2 < (min(height, width) / 4) ** 2] = (250, 240, 20)
    return Image.fromarray(rgb.astype(np.uint8))


def _noise(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _palette_with_transparency(seed):
    image = Image.fromarray(_noise((45, 60, 3), seed)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    image.info["transparency"] = 3
    return image


# (name, the image as given, the same image as transformers is given it)
IMAGES = [
    ("rgb-37x91", *[Image.fromarray(_noise((37, 91, 3), 0))] * 2),
    ("rgb-300x200", *[Image.fromarray(_noise((300, 200, 3), 1))] * 2),
    ("rgb-1x1", *[Image.fromarray(_noise((1, 1, 3), 2))] * 2),
    ("rgb-5x7-below-min", *[Image.fromarray(_noise((5, 7, 3), 3))] * 2),
    ("rgb-31x33", *[Image.fromarray(_noise((31, 33, 3), 4))] * 2),
    ("rgb-1000x1300", *[Image.fromarray(_noise((1000, 1300, 3), 5))] * 2),
    ("rgb-2x399-wide", *[Image.fromarray(_noise((2, 399, 3), 6))] * 2),
    ("rgb-611x97-tall", *[Image.fromarray(_noise((611, 97, 3), 7))] * 2),
    ("synthetic-photo-480x640", *[synthetic_photo(480, 640)] * 2),
    ("synthetic-photo-333x517", *[synthetic_photo(333, 517)] * 2),
    ("greyscale-L-123x77", *[Image.fromarray(_noise((123, 77), 8))] * 2),
    ("rgba-70x130", *[Image.fromarray(_noise((70, 130, 4), 9), mode="RGBA")] * 2),
    ("la-64x48", *[Image.fromarray(_noise((64, 48, 2), 10), mode="LA")] * 2),
    ("palette-transparency", *[_palette_with_transparency(11)] * 2),
    ("cmyk-50x90", *[Image.fromarray(_noise((50, 90, 4), 12), mode="CMYK")] * 2),
    ("numpy-hwc-257x129", *[_noise((257, 129, 3), 13)] * 2),
    ("numpy-rgba-40x41", *[_noise((40, 41, 4), 14)] * 2),
    ("numpy-greyscale-90x60", _noise((90, 60), 15), Image.fromarray(_noise((90, 60), 15))),
    ("torch-chw-3x100x150", *[torch.from_numpy(_noise((3, 100, 150), 16))] * 2),
    ("torch-hwc-100x150x3", *[torch.from_numpy(_noise((100, 150, 3), 17))] * 2),
]


def _image_items(result):
    return [item for item in result.mm_items if item.modality == "image"]


@pytest.mark.parametrize("name, image, reference_input", IMAGES, ids=[case[0] for case in IMAGES])
def test_image_pixels_equal_transformers(processor, name, image, reference_input):
    reference = reference_image_processor()(reference_input, return_tensors="pt")
    result = processor.process(IMAGE, {"image": image})
    (item,) = result.mm_items
    assert [list(item.grid_thw)] == reference["image_grid_thw"].tolist()
    assert item.pixel_values.dtype == torch.float32
    assert torch.equal(item.pixel_values, reference["pixel_values"])
    assert item.num_tokens == math.prod(item.grid_thw) // 4


@pytest.mark.parametrize("shape", [(900, 1400), (2000, 600), (64, 64)])
def test_min_and_max_pixels_kwargs_equal_transformers(processor, shape):
    image = synthetic_photo(*shape)
    kwargs = {"min_pixels": 128 * 128, "max_pixels": 300_000}
    reference = reference_image_processor(shortest_edge=kwargs["min_pixels"], longest_edge=kwargs["max_pixels"])
    expected = reference(image, return_tensors="pt")
    (item,) = processor.process(IMAGE, {"image": image}, kwargs).mm_items
    assert [list(item.grid_thw)] == expected["image_grid_thw"].tolist()
    assert torch.equal(item.pixel_values, expected["pixel_values"])
    h, w = item.grid_thw[1] * 16, item.grid_thw[2] * 16
    assert kwargs["min_pixels"] <= h * w <= kwargs["max_pixels"]


@pytest.mark.parametrize("kwargs, message", [
    ({"max_pixels": 16777216 + 1}, "over the model's limit of 16777216"),
    ({"min_pixels": 5000, "max_pixels": 4000}, "min_pixels 5000 is over max_pixels 4000"),
    ({"min_pixels": 0}, "positive integer"),
    ({"max_pixels": 1.5e5}, "positive integer"),
    ({"fps": 0}, "fps must be a positive number"),
    ({"fps": float("nan")}, "fps must be a positive number"),
    ({"resolution": 3}, "unknown mm_processor_kwargs"),
])
def test_mm_processor_kwargs_are_validated(processor, kwargs, message):
    with pytest.raises(ValueError, match=message):
        processor.process(IMAGE, {"image": synthetic_photo(40, 40)}, kwargs)


def test_two_images_with_text_between_equal_qwen3vl_processor(processor, qwen3vl_processor, tokenizer, hf_config):
    images = [synthetic_photo(37, 91), Image.fromarray(_noise((300, 200, 3), 20))]
    text = f"<|im_start|>user\nFirst:{IMAGE} then the second one,{IMAGE}what changed?<|im_end|>\n"
    expected = qwen3vl_processor(text=[text], images=images, return_tensors="pt")
    result = processor.process(text, {"image": images})
    assert result.prompt == text
    assert result.prompt_token_ids == expected["input_ids"][0].tolist()
    items = _image_items(result)
    assert [list(item.grid_thw) for item in items] == expected["image_grid_thw"].tolist()
    assert torch.equal(torch.cat([item.pixel_values for item in items]), expected["pixel_values"])
    for item in items:  # one span each, exactly the image's pads, inside its start / end pair
        ((offset, length),) = item.spans
        ids = result.prompt_token_ids
        assert length == item.num_tokens == math.prod(item.grid_thw) // 4
        assert ids[offset:offset + length] == [hf_config["image_token_id"]] * length
        assert ids[offset - 1] == hf_config["vision_start_token_id"]
        assert ids[offset + length] == hf_config["vision_end_token_id"]
    # the same prompt as token ids expands to the same ids
    from_ids = processor.process(tokenizer.encode(text), {"image": images})
    assert from_ids.prompt is None
    assert from_ids.prompt_token_ids == result.prompt_token_ids
    assert [item.spans for item in from_ids.mm_items] == [item.spans for item in items]


@pytest.mark.parametrize("num_frames", [3, 9, 50])
def test_video_prompt_equals_qwen3vl_processor(processor, qwen3vl_processor, tokenizer, hf_config, num_frames):
    video = _noise((num_frames, 48, 80, 3), num_frames)
    image = synthetic_photo(64, 64)
    text = f"<|im_start|>user\n{IMAGE}and this clip:{VIDEO}What happens?<|im_end|>\n"
    expected = qwen3vl_processor(text=[text], images=[image], videos=[video], return_tensors="pt")
    result = processor.process(text, {"image": image, "video": video})
    assert result.prompt_token_ids == expected["input_ids"][0].tolist()
    image_item, video_item = result.mm_items
    assert (image_item.modality, video_item.modality) == ("image", "video")
    assert [list(video_item.grid_thw)] == expected["video_grid_thw"].tolist()
    t, h, w = video_item.grid_thw
    assert len(video_item.spans) == t and all(length == h * w // 4 for _, length in video_item.spans)
    ids = result.prompt_token_ids
    for offset, length in video_item.spans:
        assert ids[offset:offset + length] == [hf_config["video_token_id"]] * length
        assert ids[offset - 1] == hf_config["vision_start_token_id"] and ids[offset + length] == hf_config[
            "vision_end_token_id"]
    assert len(re.findall(r"<\d+\.\d seconds><\|vision_start\|>", tokenizer.decode(ids))) == t
    from_ids = processor.process(tokenizer.encode(text), {"image": image, "video": video})
    assert from_ids.prompt_token_ids == ids


@pytest.mark.parametrize("cap_pixels_per_frame", [False, True])
def test_video_pixels_equal_transformers(tmp_path, hf_config, tokenizer, cap_pixels_per_frame):
    pytest.importorskip("torchvision")
    from transformers import Qwen3VLVideoProcessor

    config = {**VIDEO_CONFIG, "cap_pixels_per_frame": cap_pixels_per_frame}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(config))
    processor = MultiModalProcessor.from_model_dir(tmp_path, hf_config, tokenizer)
    reference = Qwen3VLVideoProcessor(**config)
    # the last is over the per-frame cap, so the cap shrinks its frames
    for num_frames, height, width in [(3, 37, 91), (8, 300, 200), (50, 120, 160), (8, 900, 1000)]:
        video = _noise((num_frames, height, width, 3), height)
        expected = reference(videos=[video], return_tensors="pt")
        (item,) = processor.process(VIDEO, {"video": video}).mm_items
        assert [list(item.grid_thw)] == expected["video_grid_thw"].tolist()
        assert torch.equal(item.pixel_values, expected["pixel_values_videos"])
    assert (item.grid_thw[1] * item.grid_thw[2] < 56 * 62) == cap_pixels_per_frame


def test_video_inputs_of_every_kind_agree(processor):
    video = _noise((6, 40, 60, 3), 30)
    as_array = processor.process(VIDEO, {"video": video}).mm_items[0]
    for other in ([Image.fromarray(frame) for frame in video], list(video), torch.from_numpy(video),
                  torch.from_numpy(video).permute(0, 3, 1, 2)):
        item = processor.process(VIDEO, {"video": other}).mm_items[0]
        assert item.content_hash == as_array.content_hash
    two = processor.process(VIDEO + VIDEO, {"video": [video, list(video[:4])]})
    assert [item.grid_thw[0] for item in two.mm_items] == [2, 2]


def _encode_video(num_frames: int, fps: int, container_format: str = "mp4") -> bytes:
    av = pytest.importorskip("av")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for i in range(num_frames):
            frame = av.VideoFrame.from_ndarray(_noise((64, 96, 3), i), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


def test_video_file_is_sampled_at_fps_from_its_own_frame_rate(processor):
    data = _encode_video(num_frames=30, fps=10)  # 3 s: 6 frames at 2 fps, indices 0 6 12 17 23 29
    result = processor.process(VIDEO, {"video": data})
    (item,) = result.mm_items
    assert item.grid_thw == (3, 4, 6)
    text = processor.tokenizer.decode(result.prompt_token_ids)
    # each step's time is the mean of its two frames': (0 + 0.6) / 2, (1.2 + 1.7) / 2, (2.3 + 2.9) / 2
    assert re.findall(r"<(\d+\.\d) seconds>", text) == ["0.3", "1.4", "2.6"]
    slower = processor.process(VIDEO, {"video": data}, {"fps": 1}).mm_items[0]
    assert slower.grid_thw[0] == 2  # 3 frames at 1 fps, raised to min_frames 4
    with pytest.raises(MediaError, match="cannot decode the video"):
        processor.process(VIDEO, {"video": b"not a video" * 100})
    nut = _encode_video(num_frames=4, fps=10, container_format="nut")  # FFmpeg reads it, but not from a client
    with pytest.raises(MediaError, match="cannot decode the video"):
        processor.process(VIDEO, {"video": nut})


def test_video_file_equals_transformers_pyav_loader(processor, tmp_path):
    pytest.importorskip("torchvision")
    from transformers import Qwen3VLVideoProcessor
    from transformers.video_utils import load_video

    reference = Qwen3VLVideoProcessor(**VIDEO_CONFIG, cap_pixels_per_frame=False)
    for num_frames, fps in [(30, 10), (7, 25), (200, 30)]:
        path = tmp_path / f"{num_frames}.mp4"
        path.write_bytes(_encode_video(num_frames, fps))
        frames, metadata = load_video(str(path), backend="pyav",
                                      sample_indices_fn=lambda metadata, **kwargs: reference.sample_frames(metadata))
        expected = reference(videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt")
        (item,) = processor.process(VIDEO, {"video": path.read_bytes()}).mm_items
        assert [list(item.grid_thw)] == expected["video_grid_thw"].tolist()
        assert torch.equal(item.pixel_values, expected["pixel_values_videos"])


def test_video_file_without_pyav_says_to_install_it(processor, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ValueError, match="pip install av"):
        processor.process(VIDEO, {"video": b"\x00\x00\x00\x18ftypmp42"})


def test_placeholder_and_item_counts_must_match(processor, tokenizer):
    image = synthetic_photo(40, 40)
    with pytest.raises(ValueError, match=r"prompt has 2 <\|image_pad\|> placeholder\(s\) but 1 image"):
        processor.process(IMAGE + IMAGE, {"image": [image]})
    with pytest.raises(ValueError, match=r"prompt has 0 <\|video_pad\|> placeholder\(s\) but 1 video"):
        processor.process(IMAGE, {"image": image, "video": _noise((4, 32, 32, 3), 0)})
    with pytest.raises(ValueError, match=r"prompt has 1 <\|image_pad\|> placeholder\(s\) but 0 image"):
        processor.process(tokenizer.encode(IMAGE), {})
    with pytest.raises(ValueError, match="unknown multi_modal_data keys"):
        processor.process(IMAGE, {"images": [image]})


def test_bad_images_are_value_errors(processor):
    with pytest.raises(ValueError, match="aspect ratio"):
        processor.process(IMAGE, {"image": Image.new("RGB", (300, 1))})
    with pytest.raises(ValueError, match="uint8"):
        processor.process(IMAGE, {"image": np.zeros((10, 10, 3), np.float32)})
    with pytest.raises(ValueError, match="at least 2 frames"):
        processor.process(VIDEO, {"video": _noise((1, 32, 32, 3), 0)})


def test_content_hash(processor):
    pixels = _noise((60, 80, 3), 40)
    first = processor.process(IMAGE, {"image": Image.fromarray(pixels)}).mm_items[0]
    again = processor.process(IMAGE, {"image": pixels.copy()}).mm_items[0]
    assert first.content_hash == again.content_hash and len(first.content_hash) == 64
    changed = pixels.copy()
    changed[30, 40, 1] ^= 0x80
    other = processor.process(IMAGE, {"image": changed}).mm_items[0]
    assert other.grid_thw == first.grid_thw and other.content_hash != first.content_hash
    smaller = processor.process(IMAGE, {"image": pixels}, {"max_pixels": 30000}).mm_items[0]
    assert smaller.grid_thw != first.grid_thw and smaller.content_hash != first.content_hash


def test_images_by_path_and_data_url_follow_the_media_policy(model_dir, hf_config, tokenizer, tmp_path):
    import base64

    image = synthetic_photo(50, 70)
    path = tmp_path / "photo.png"
    image.save(path)
    data_url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    allowed = MultiModalProcessor.from_model_dir(model_dir, hf_config, tokenizer,
                                                 MediaPolicy(allowed_local_media_path=str(tmp_path)))
    expected = allowed.process(IMAGE, {"image": image}).mm_items[0].content_hash
    for source in (str(path), path.as_uri(), data_url, path.read_bytes()):
        assert allowed.process(IMAGE, {"image": source}).mm_items[0].content_hash == expected
    default = MultiModalProcessor.from_model_dir(model_dir, hf_config, tokenizer)
    with pytest.raises(MediaError, match="allowed_local_media_path"):
        default.process(IMAGE, {"image": str(path)})


def test_defaults_without_preprocessor_files(tmp_path, hf_config, tokenizer):
    processor = MultiModalProcessor.from_model_dir(tmp_path, hf_config, tokenizer)
    image = processor.image_config
    assert (image.patch_size, image.temporal_patch_size, image.merge_size) == (16, 2, 2)
    assert (image.min_pixels, image.max_pixels, image.image_mean) == (65536, 16777216, (0.5, 0.5, 0.5))
    video = processor.video_config
    assert (video.pixels.min_pixels, video.pixels.max_pixels) == (128 * 32 * 32, 32 * 32 * 768)
    assert (video.fps, video.min_frames, video.max_frames) == (2.0, 4, 768)


def test_video_file_frames_over_max_pixels_refused(model_dir, hf_config, tokenizer):
    data = _encode_video(num_frames=4, fps=10)  # 96x64 frames
    strict = MultiModalProcessor.from_model_dir(model_dir, hf_config, tokenizer, MediaPolicy(max_pixels=96 * 64 - 1))
    with pytest.raises(MediaError, match="96x64, over the limit of 6143 pixels"):
        strict.process(VIDEO, {"video": data})
