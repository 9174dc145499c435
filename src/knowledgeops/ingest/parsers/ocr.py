"""Reading the text of page images (scanned PDF pages, photos, TIFF scans) with OCR.

The engine is RapidOCR (`rapidocr-onnxruntime`: the PP-OCRv4 detection and recognition models
inside the wheel, run by ONNX Runtime), chosen by measurement over Tesseract
(docs/formats.md "OCR"): on the same scans its character error rate is lower on Chinese and
about the same on English, and it reads a page about three times faster; it needs no system
package. Its text-orientation classifier is off: on English pages it turned lines upside down.

Text is found on a copy of the page scaled to `DETECT_SIDE` pixels (detection costs memory as
the square of the side) and read from the full-resolution page, line by line, so small print
keeps its detail. A page's confidence is the recognition scores' mean weighted by characters.
The engine is loaded once per parser process, on the first page that needs it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

DETECT_SIDE = 960  # px: the longest side of the image text is detected on
# the detection copy's long side over its short side at most (padded to it): the detector scales
# an image up until its short side is 736 px, so a strip of 960 × 5 became 141,000 × 736 and took
# minutes; at 4 to 1 it is at most 2,944 × 736
DETECT_MAX_ASPECT = 4
MIN_SCORE = 0.5  # a recognised line scoring less is dropped (RapidOCR's own default)
REC_BATCH = 8  # lines recognised at once
LANGUAGES = frozenset({"en", "zh"})  # what the bundled models read (Latin script and Chinese)
DEFAULT_LANGUAGES = ("en", "zh")
ROW_TOLERANCE = 0.5  # boxes whose centres are this many line heights apart share a row


@dataclass(frozen=True, slots=True)
class OcrPage:
    """What OCR read on one page: its lines in reading order, and the confidence (0–1) of the
    text as a whole (None when the page holds no text at all)."""

    text: str
    confidence: float | None


class OcrUnavailable(RuntimeError):
    """The OCR engine cannot be loaded here (its package is missing or broken)."""


_LOAD_LOCK = threading.Lock()


@functools.cache
def _engine(threads: int) -> Any:
    with _LOAD_LOCK:
        try:
            from rapidocr_onnxruntime import RapidOCR  # noqa: PLC0415 (loaded by the first page that needs OCR, in the parser process)
        except ImportError as exc:  # pragma: no cover - a broken install
            raise OcrUnavailable(f"the OCR engine could not be loaded: {exc}") from exc
        options: dict[str, Any] = {"use_cls": False, "print_verbose": False}
        if threads > 0:
            options.update(intra_op_num_threads=threads, inter_op_num_threads=1)
        return RapidOCR(**options)


def _rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        return np.ascontiguousarray(np.stack([image] * 3, axis=-1))
    if image.shape[2] == 4:
        return np.ascontiguousarray(image[:, :, :3])
    return np.ascontiguousarray(image)


def _detect(engine: Any, image: np.ndarray) -> list[np.ndarray]:
    """Text boxes on `image`, found on a copy scaled to DETECT_SIDE, in full-size coordinates."""
    import cv2  # noqa: PLC0415 (with the engine)

    height, width = image.shape[:2]
    scale = min(1.0, DETECT_SIDE / max(height, width))
    small = image
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    small = _padded(small)
    boxes, _ = engine.auto_text_det(small)
    if boxes is None:
        return []
    found = [np.asarray(box, dtype=np.float32) / scale for box in boxes]
    for box in found:
        box[:, 0] = np.clip(box[:, 0], 0, width - 1)
        box[:, 1] = np.clip(box[:, 1], 0, height - 1)
    return found


def _padded(image: np.ndarray) -> np.ndarray:
    """`image` with its short side padded to a `DETECT_MAX_ASPECT`th of its long side (below or
    to the right, so the boxes' coordinates stay the image's), in its background's colour."""
    height, width = image.shape[:2]
    short = -(-max(height, width) // DETECT_MAX_ASPECT)
    if min(height, width) >= short:
        return image
    shape = (max(height, short), max(width, short), image.shape[2])
    background = np.median(image.reshape(-1, image.shape[2]), axis=0)
    padded = np.empty(shape, dtype=image.dtype)
    padded[:] = background.astype(image.dtype)
    padded[:height, :width] = image
    return padded


def _rows(lines: list[tuple[np.ndarray, str]]) -> list[str]:
    """Recognised lines as rows of text: boxes at the same height joined left to right."""
    rows: list[list[tuple[float, float, float, str]]] = []
    for box, text in lines:
        top, bottom = float(box[:, 1].min()), float(box[:, 1].max())
        left = float(box[:, 0].min())
        centre, height = (top + bottom) / 2, max(bottom - top, 1.0)
        row = rows[-1] if rows else None
        if row is not None:
            last_centre = sum(item[0] for item in row) / len(row)
            if abs(centre - last_centre) <= ROW_TOLERANCE * height:
                row.append((centre, left, height, text))
                continue
        rows.append([(centre, left, height, text)])
    return [" ".join(text for _, _, _, text in sorted(row, key=lambda i: i[1])) for row in rows]


def available_languages() -> frozenset[str]:
    """The languages a dataset may ask OCR for here: the bundled models' and those of an
    installed Tesseract (tesseract.py)."""
    from knowledgeops.ingest.parsers import tesseract  # noqa: PLC0415 (its probe runs a program)

    return LANGUAGES | tesseract.available_languages()


_LANGUAGES: ContextVar[tuple[str, ...]] = ContextVar(
    "kops_ocr_languages", default=DEFAULT_LANGUAGES
)


@contextmanager
def using_languages(languages: Sequence[str] | None) -> Iterator[None]:
    """OCR in `languages` (a dataset's setting) for the parse in this context."""
    token = _LANGUAGES.set(tuple(languages) if languages else DEFAULT_LANGUAGES)
    try:
        yield
    finally:
        _LANGUAGES.reset(token)


def read_page(image: np.ndarray, threads: int = 0) -> OcrPage:
    """OCR one page image in the languages of this parse: RapidOCR when its bundled models read
    them all (English, Chinese), else Tesseract with each language's data."""
    languages = _LANGUAGES.get()
    if set(languages) <= LANGUAGES:
        return read_image(image, threads)
    from knowledgeops.ingest.parsers import tesseract  # noqa: PLC0415 (the second engine, for other languages)

    missing = sorted(set(languages) - tesseract.available_languages())
    if missing:
        raise OcrUnavailable(
            f"OCR in {', '.join(missing)} needs Tesseract with that language's data on this "
            "worker (apt-get install tesseract-ocr "
            + " ".join(
                f"tesseract-ocr-{tesseract.TESSERACT_CODES.get(m, m).replace('_', '-')}"
                for m in missing
            )
            + ")"
        )
    return tesseract.read_image(image, languages, threads)


def read_image(image: np.ndarray, threads: int = 0) -> OcrPage:
    """OCR one page image (grey, RGB or RGBA, uint8) with RapidOCR; `threads` for the model
    (0: its default, all cores)."""
    engine = _engine(threads)
    rgb = _rgb(image)
    boxes = _detect(engine, rgb)
    _trim()  # detection's buffers, before recognition makes its own
    lines: list[tuple[np.ndarray, str]] = []
    weighted = 0.0
    chars = 0
    for start in range(0, len(boxes), REC_BATCH):
        batch = boxes[start : start + REC_BATCH]
        crops = engine.get_crop_img_list(rgb, batch)
        results, _ = engine.text_rec(crops)
        for box, (raw, score) in zip(batch, results, strict=True):
            text = " ".join(str(raw).split())
            if not text:
                continue
            # a line too unsure to keep still counts against the page's confidence
            weighted += float(score) * len(text)
            chars += len(text)
            if float(score) >= MIN_SCORE:
                lines.append((box, text))
    del rgb, boxes
    _trim()
    if not chars:
        return OcrPage(text="", confidence=None)
    return OcrPage(text="\n".join(_rows(lines)), confidence=weighted / chars)


@functools.cache
def _libc() -> Any:
    import ctypes  # noqa: PLC0415
    import ctypes.util  # noqa: PLC0415

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _trim() -> None:
    """Give the memory a page's images and tensors used back to the system (glibc keeps freed
    heap memory for reuse: without this a parser process that has read a few pages holds
    their peak for good)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
