"""What every parser produces and the one protocol they share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class ContentType:
    """Canonical content types KnowledgeOps can parse (stored on each document)."""

    PDF = "application/pdf"
    DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    HTML = "text/html"
    MARKDOWN = "text/markdown"
    TEXT = "text/plain"
    PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    CSV = "text/csv"
    EPUB = "application/epub+zip"
    EMAIL = "message/rfc822"
    MBOX = "application/mbox"
    PNG = "image/png"
    JPEG = "image/jpeg"
    TIFF = "image/tiff"
    WEBP = "image/webp"
    BMP = "image/bmp"

    IMAGES = (PNG, JPEG, TIFF, WEBP, BMP)
    ALL = (PDF, DOCX, HTML, MARKDOWN, TEXT, PPTX, XLSX, CSV, EPUB, EMAIL, MBOX, *IMAGES)


@dataclass(frozen=True, slots=True)
class Block:
    """A run of text in reading order, with where it came from.

    `page` is 1-based and set only for paged formats (a PDF's page, a presentation's slide).
    `section` is the heading path ("Chapter 4 › Ownership") where the format has headings, else
    None.
    """

    text: str
    page: int | None = None
    section: str | None = None


class Parser(Protocol):
    """Turns one stored file into blocks of text, lazily, in reading order.

    A parser raises `PermanentError` or `UserActionRequired` (knowledgeops.errors) with a message a
    person can act on when the file cannot be read; it never returns silently on a corrupt file.
    """

    content_type: str

    def parse(self, path: Path) -> Iterator[Block]: ...
