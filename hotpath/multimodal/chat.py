"""Images and videos inside chat messages: OpenAI's `image_url` content parts, vLLM's `video_url`,
and the `{"type": "image", "image": ...}` parts of transformers' chat format, taken out of the
messages in order (as a prompt's `multi_modal_data`) and left as the placeholder parts the Qwen
chat templates render as <|vision_start|><|image_pad|><|vision_end|>."""

from __future__ import annotations

from typing import Any

# content part type -> (modality, the key holding its source)
_MEDIA_PARTS = {"image_url": ("image", "image_url"), "image": ("image", "image"),
                "video_url": ("video", "video_url"), "video": ("video", "video")}


def extract_media(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """(the messages with each media part a bare placeholder, {"image": [...], "video": [...]}
    holding each part's source: a URL, a path, or an image object); ValueError for a content
    part it cannot read."""
    media: dict[str, list[Any]] = {}
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _MEDIA_PARTS:
                parts.append(part)
                continue
            modality, key = _MEDIA_PARTS[kind]
            source = part.get(key)
            if isinstance(source, dict):  # {"url": ...}, OpenAI's shape
                source = source.get("url")
            if source is None:
                raise ValueError(f"a {kind!r} content part needs its {key!r} (a URL, or {{\"url\": ...}})")
            media.setdefault(modality, []).append(source)
            parts.append({"type": modality})
        out.append({**message, "content": parts})
    return out, media
