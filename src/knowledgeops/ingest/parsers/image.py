"""Images (PNG, JPEG, TIFF, multi-page TIFF, WebP, BMP) read by OCR (ocr.py) with Pillow: each
frame a page, one frame decoded at a time.

A frame larger than KOPS_MAX_IMAGE_PIXELS is refused before it is decoded (Pillow reads the
size from the header); a photo larger than `MAX_OCR_SIDE` on its longest side is scaled down
first (OCR reads small print at 200 dpi; a phone's 12-megapixel photo of a page is plenty).
Photos are turned upright by their EXIF orientation.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import progress
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.pdf import ocr_page
from knowledgeops.ingest.parsers.progress import OcrProgress

MAX_OCR_SIDE = 4_000  # px: a larger image is scaled down to this before OCR
MAX_FRAMES = 5_000  # pages of one TIFF (as KOPS_MAX_PDF_PAGES' default)

NO_TEXT_MESSAGE = (
    "No text was found in the image: OCR read no text on it that it was sure of. Check "
    "that the scan or photo is legible (at least 200 dpi, upright, in focus) and upload it again."
)


# Frames are checked against KOPS_MAX_IMAGE_PIXELS before they are decoded (`_checked_size`),
# in place of Pillow's own fixed guard.
Image.MAX_IMAGE_PIXELS = None


# What Pillow raises on a damaged image (a truncated read, a bad header or tag, a frame that
# does not decode). The file itself is opened before Pillow sees it, so an OSError from here
# on is the image's, not the storage's.
DECODE_ERRORS = (OSError, ValueError, EOFError, SyntaxError, IndexError, KeyError, struct.error,
                 ZeroDivisionError, TypeError)  # fmt: skip


def _damaged(exc: BaseException, page: int | None = None) -> PermanentError:
    where = f"Page {page} of the image" if page is not None and page > 1 else "The image"
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return PermanentError(
        f"{where} could not be decoded ({reason}); it may be damaged. Export it again and "
        "upload the new copy.",
        code="corrupt_file",
    )


def _checked_size(image: Image.Image, page: int) -> None:
    most = current_limits().max_image_pixels
    width, height = image.size
    if width * height > most:
        where = f"Page {page} of the image" if page > 1 else "The image"
        raise UserActionRequired(
            f"{where} is {width:,} × {height:,} pixels; this server reads images of at most "
            f"{most:,} pixels (KOPS_MAX_IMAGE_PIXELS). Scale it down (200–300 dpi is enough "
            "for OCR) and upload it again.",
            code="image_too_large",
        )


def _pixels(image: Image.Image) -> np.ndarray:
    """The frame as an upright grey array, at most MAX_OCR_SIDE on its longest side."""
    frame = ImageOps.exif_transpose(image) or image
    frame = frame.convert("L")
    if max(frame.size) > MAX_OCR_SIDE:
        frame.thumbnail((MAX_OCR_SIDE, MAX_OCR_SIDE), Image.Resampling.LANCZOS)
    return np.asarray(frame)


class ImageParser:
    """Scans and photos of text, one block per frame (page)."""

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type

    def parse(self, path: Path) -> Iterator[Block]:
        with path.open("rb") as fh:
            try:
                image = Image.open(fh)
                frames = min(getattr(image, "n_frames", 1), MAX_FRAMES)
            except UnidentifiedImageError as exc:
                raise _damaged(exc) from exc
            except DECODE_ERRORS as exc:
                raise _damaged(exc) from exc
            try:
                yield from self._frames(image, frames)
            finally:
                image.close()

    @staticmethod
    def _frames(image: Image.Image, frames: int) -> Iterator[Block]:
        progress.report(OcrProgress(0, frames))
        found = False
        for index in range(frames):
            try:
                image.seek(index)
                _checked_size(image, index + 1)
                pixels = _pixels(image)
            except DECODE_ERRORS as exc:
                raise _damaged(exc, index + 1) from exc
            text = ocr_page(pixels, index + 1, index + 1, frames)
            del pixels
            if text.strip():
                found = True
                yield Block(text=text, page=index + 1)
        if not found:
            raise PermanentError(NO_TEXT_MESSAGE, code="no_text_found")


IMAGE_TYPES = (
    ContentType.PNG,
    ContentType.JPEG,
    ContentType.TIFF,
    ContentType.WEBP,
    ContentType.BMP,
)
