"""Plain text: decoded as a stream and cut into blocks at blank lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.encoding import iter_decoded

TARGET_BLOCK_CHARS = 16 * 1024
"""A block is cut at the last blank line once it has at least this much text."""

MAX_BLOCK_CHARS = 32 * 1024
"""A block with no blank line is cut at a line end (or a space) once it is this long."""


def _cut_point(buffer: str, target: int, limit: int) -> int:
    """Where to end the next block of `buffer` (len(buffer) >= target), or -1 to read more."""
    cut = buffer.rfind("\n\n", target // 4, limit)
    if cut != -1:
        return cut + 2
    if len(buffer) < limit:
        return -1
    for sep in ("\n", " "):
        cut = buffer.rfind(sep, target // 4, limit)
        if cut != -1:
            return cut + 1
    return limit


def split_paragraph_groups(
    pieces: Iterable[str],
    target: int = TARGET_BLOCK_CHARS,
    limit: int = MAX_BLOCK_CHARS,
) -> Iterator[str]:
    """Regroup a stream of text pieces into groups of whole paragraphs of about `target` chars.

    Holds at most about `limit` characters (plus one piece) at a time. Groups are stripped of
    surrounding blank lines; groups with no visible text are dropped.
    """
    buffer = ""
    for piece in pieces:
        buffer += piece
        while len(buffer) >= target:
            cut = _cut_point(buffer, target, limit)
            if cut == -1:
                break
            group, buffer = buffer[:cut], buffer[cut:]
            group = group.strip("\n")
            if group.strip():
                yield group
    group = buffer.strip("\n")
    if group.strip():
        yield group


class TextParser:
    """Plain text in any common encoding (BOM, UTF-8, else detected)."""

    content_type = ContentType.TEXT

    def parse(self, path: Path) -> Iterator[Block]:
        for group in split_paragraph_groups(iter_decoded(path)):
            yield Block(text=group)
