"""Tags in streamed model text: a chunk may end partway through a tag that the next chunk completes."""

from __future__ import annotations


def partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins one of `tags` without completing it:
    the characters a streaming parser must hold back until the next chunk says what they are."""
    longest = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:n]):
                longest = n
                break
    return longest


def find_first(text: str, tags: tuple[str, ...], start: int = 0) -> tuple[int, str | None]:
    """(index, tag) of the earliest of `tags` in text[start:]; (-1, None) if none occurs."""
    best, found = -1, None
    for tag in tags:
        i = text.find(tag, start)
        if i != -1 and (best == -1 or i < best):
            best, found = i, tag
    return best, found
