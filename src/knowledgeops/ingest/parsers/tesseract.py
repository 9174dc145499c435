"""Tesseract, the OCR engine for the languages RapidOCR's bundled models do not read (Japanese,
Korean, German, French, …): its command-line program, run on one page image at a time, its
TSV output read for the words, their lines and their confidences.

Optional: Tesseract is a system package (`apt-get install tesseract-ocr tesseract-ocr-jpn …`).
A dataset may ask for a language only when its data is installed (`available_languages`); the
program inherits the parser process's memory limit, and the parser's time limit stops it with
the process.
"""

from __future__ import annotations

import csv
import functools
import io
import shutil
import subprocess

import numpy as np

from knowledgeops.ingest.parsers.ocr import OcrPage, OcrUnavailable

# ISO 639-1 codes a dataset names → Tesseract's data files
TESSERACT_CODES = {
    "en": "eng",
    "zh": "chi_sim",
    "zh-tw": "chi_tra",
    "ja": "jpn",
    "ko": "kor",
    "de": "deu",
    "fr": "fra",
    "es": "spa",
    "it": "ita",
    "pt": "por",
    "nl": "nld",
    "ru": "rus",
    "ar": "ara",
    "hi": "hin",
}
MIN_CONFIDENCE = 50  # a word Tesseract scores lower (0–100) counts against the page, not in it
RUN_TIMEOUT_S = 300.0


@functools.cache
def available_languages() -> frozenset[str]:
    """The languages whose data the installed Tesseract has (none when it is not installed)."""
    program = shutil.which("tesseract")
    if program is None:
        return frozenset()
    try:
        listed = subprocess.run(
            [program, "--list-langs"], capture_output=True, check=True, timeout=30
        ).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    installed = set(listed.split())
    return frozenset(code for code, data in TESSERACT_CODES.items() if data in installed)


def read_image(image: np.ndarray, languages: tuple[str, ...], threads: int = 0) -> OcrPage:
    """OCR one grey page image with Tesseract in `languages` (codes of TESSERACT_CODES)."""
    from PIL import Image  # noqa: PLC0415 (with the parsers that hand it images)

    program = shutil.which("tesseract")
    if program is None:
        raise OcrUnavailable("Tesseract is not installed")
    codes = "+".join(TESSERACT_CODES[language] for language in languages)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    env = {"OMP_THREAD_LIMIT": str(threads)} if threads > 0 else {}
    try:
        done = subprocess.run(
            [program, "stdin", "stdout", "-l", codes, "--psm", "3", "tsv"],
            input=buffer.getvalue(),
            capture_output=True,
            check=True,
            timeout=RUN_TIMEOUT_S,
            env={**_base_env(), **env},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OcrUnavailable(f"Tesseract failed on the page: {exc}") from exc
    return _page(done.stdout.decode("utf-8", "replace"))


def _base_env() -> dict[str, str]:
    import os  # noqa: PLC0415

    return {k: v for k, v in os.environ.items() if k in ("PATH", "TESSDATA_PREFIX", "LANG")}


def _page(tsv: str) -> OcrPage:
    """Tesseract's TSV (one row per word, with its block, paragraph and line) as a page."""
    lines: dict[tuple[str, str, str], list[str]] = {}
    weighted = 0.0
    chars = 0
    for row in csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE):
        text = (row.get("text") or "").strip()
        if row.get("level") != "5" or not text:
            continue
        try:
            confidence = float(row.get("conf") or -1)
        except ValueError:
            continue
        if confidence < 0:
            continue
        weighted += confidence / 100 * len(text)
        chars += len(text)
        if confidence >= MIN_CONFIDENCE:
            key = (row.get("block_num", ""), row.get("par_num", ""), row.get("line_num", ""))
            lines.setdefault(key, []).append(text)
    if not chars:
        return OcrPage(text="", confidence=None)
    return OcrPage("\n".join(_joined(words) for words in lines.values()), weighted / chars)


def _unspaced(char: str) -> bool:
    """Han ideographs, kana and full-width punctuation: scripts written without spaces."""
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF  # CJK punctuation, hiragana, katakana
        or 0x3400 <= code <= 0x9FFF  # CJK ideographs
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
    )


def _joined(words: list[str]) -> str:
    """A line's words: spaced, except between two of a script written without spaces (Tesseract
    cuts Chinese and Japanese into words the text never separated)."""
    out = words[0]
    for word in words[1:]:
        out += word if _unspaced(out[-1]) and _unspaced(word[0]) else " " + word
    return out
