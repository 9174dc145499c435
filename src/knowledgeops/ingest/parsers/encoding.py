"""Character-encoding detection and streaming decoding shared by the text-based parsers.

Order of evidence: a byte-order mark, then strict UTF-8 on a sample, then charset-normalizer on the
same sample (with a bias to Windows-1252 when it cannot tell Western single-byte code pages apart).
Decoding never fails: bytes that are invalid in the chosen encoding become U+FFFD.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

import charset_normalizer

SAMPLE_SIZE = 64 * 1024
"""Bytes read from the start of a file to decide its encoding."""

PIECE_SIZE = 64 * 1024
"""Bytes read per step when decoding a file as a stream."""

FALLBACK_ENCODING = "cp1252"

# UTF-32 first: its little-endian BOM starts with the UTF-16 one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)

# Multi-byte encodings charset-normalizer names, mapped to the superset Python decodes best.
_SUPERSETS = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
}
_MULTIBYTE = frozenset(
    {
        "gb18030",
        "cp932",
        "euc_jp",
        "cp949",
        "big5hkscs",
        "iso2022_jp",
        "utf-16-le",
        "utf-16-be",
        "utf-32-le",
        "utf-32-be",
    }
)


# Python names of single-byte code pages for Latin scripts (charset-normalizer's candidates).
_LATIN_SINGLE_BYTE = frozenset(
    {
        "cp1250",
        "cp1252",
        "cp1254",
        "cp1257",
        "cp1258",
        "iso8859-1",
        "iso8859-2",
        "iso8859-3",
        "iso8859-4",
        "iso8859-9",
        "iso8859-10",
        "iso8859-13",
        "iso8859-14",
        "iso8859-15",
        "iso8859-16",
        "mac-latin2",
        "mac-roman",
        "cp437",
        "cp775",
        "cp850",
        "cp852",
        "cp858",
    }
)
_NON_WESTERN_LATIN_LANGUAGES = frozenset(
    {
        "Polish",
        "Czech",
        "Slovak",
        "Hungarian",
        "Croatian",
        "Slovene",
        "Lithuanian",
        "Latvian",
        "Estonian",
        "Turkish",
    }
)


def bom_encoding(head: bytes) -> str | None:
    """The codec for a byte-order mark at the start of `head` (the codec strips it), else None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    return None


def codec_name(label: str) -> str | None:
    """Python's canonical name for an encoding label, or None when Python does not know it."""
    try:
        info = codecs.lookup(label.strip().lower())
    except LookupError:
        return None
    # Reject the bytes-to-bytes and text-to-text pseudo codecs (base64, rot13, …).
    if not getattr(info, "_is_text_encoding", True):
        return None
    return info.name


def _is_utf8(sample: bytes, complete: bool) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    try:
        decoder.decode(sample, final=complete)
    except UnicodeDecodeError:
        return False
    return True


def _mostly_utf8(sample: bytes) -> bool:
    """UTF-8 text with a few stray invalid bytes (a bad paste, a truncated character): many valid
    multi-byte characters and next to no invalid bytes. Legacy 8-bit text has the reverse."""
    text = sample.decode("utf-8", errors="replace")
    invalid = text.count("\ufffd")
    valid = sum(1 for ch in text if ord(ch) > 0x7F) - invalid
    return valid >= 20 * invalid and invalid <= max(1, len(sample) // 1000)


def _trim_sample(sample: bytes) -> bytes:
    """Cut a partial sample at a line end so no multi-byte character is split at its end."""
    cut = sample.rfind(b"\n")
    if cut >= len(sample) // 2:
        return sample[: cut + 1]
    return sample


def _strictly_decodes(sample: bytes, encoding: str, complete: bool) -> bool:
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    try:
        decoder.decode(sample, final=complete)
    except UnicodeDecodeError:
        return False
    return True


def _reads_as_western(sample: bytes, complete: bool) -> bool:
    """Whether the sample, read as Windows-1252, looks like a Western language: valid, and mostly
    ASCII letters (Cyrillic or Greek bytes read as cp1252 give words made only of accented ones)."""
    if not _strictly_decodes(sample, FALLBACK_ENCODING, complete):
        return False
    text = sample.decode(FALLBACK_ENCODING, errors="replace")
    letters = [ch for ch in text if ch.isalpha()]
    accented = sum(1 for ch in letters if not ch.isascii())
    return accented <= 0.3 * len(letters)


def detect_encoding(sample: bytes, *, complete: bool = False) -> str:
    """Decide the encoding of text whose first bytes are `sample`.

    `complete` says the sample is the whole file (so a truncated character at its end is an error,
    not an artefact of sampling). Returns a Python codec name; BOM codecs strip their BOM.
    """
    bom = bom_encoding(sample)
    if bom is not None:
        return bom
    if _is_utf8(sample, complete):
        return "utf-8"
    if not complete:
        sample = _trim_sample(sample)
    if _mostly_utf8(sample):
        return "utf-8"
    return _guess(sample, complete)


def _guess(sample: bytes, complete: bool) -> str:
    matches = charset_normalizer.from_bytes(sample)
    best = matches.best()
    if best is None:
        return FALLBACK_ENCODING
    name = codec_name(best.encoding) or FALLBACK_ENCODING
    name = _SUPERSETS.get(name, name)
    if name in _MULTIBYTE:
        return name
    if name not in _LATIN_SINGLE_BYTE:
        # Another script's code page: trust it only with some language evidence (a few accented
        # words give none, and then any code page "fits").
        if best.percent_coherence == 0.0 and _reads_as_western(sample, complete):
            return FALLBACK_ENCODING
        return name
    # A Latin-script single-byte code page: charset-normalizer cannot tell these apart reliably
    # (it calls French cp1250 and Danish cp1257). Windows-1252 (a superset of Latin-1) is by far
    # the most common, so it wins unless the language found needs another code page.
    if best.language in _NON_WESTERN_LATIN_LANGUAGES:
        return name
    if _strictly_decodes(sample, FALLBACK_ENCODING, complete):
        return FALLBACK_ENCODING
    return name


def detect_file_encoding(path: Path) -> str:
    """Detect the encoding of a file from its first `SAMPLE_SIZE` bytes."""
    with path.open("rb") as fh:
        sample = fh.read(SAMPLE_SIZE + 1)
    complete = len(sample) <= SAMPLE_SIZE
    return detect_encoding(sample[:SAMPLE_SIZE], complete=complete)


def _normalise_newlines(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def iter_decoded(
    path: Path, encoding: str | None = None, piece_size: int = PIECE_SIZE
) -> Iterator[str]:
    """Decode a file piece by piece (never holding it whole), with newlines normalised to \\n.

    Invalid bytes become U+FFFD. Pieces are non-empty and may end anywhere, even mid-line.
    """
    name = encoding or detect_file_encoding(path)
    decoder = codecs.getincrementaldecoder(name)(errors="replace")
    pending_cr = ""
    with path.open("rb") as fh:
        while True:
            raw = fh.read(piece_size)
            final = not raw
            text = pending_cr + decoder.decode(raw, final=final)
            pending_cr = ""
            if not final and text.endswith("\r"):
                # A "\r\n" may be split between two pieces: decide once the next piece is here.
                pending_cr = "\r"
                text = text[:-1]
            text = _normalise_newlines(text)
            if text:
                yield text
            if final:
                return


def decode_bytes(data: bytes, encoding: str | None = None) -> str:
    """Decode a whole byte string (detecting its encoding unless given); invalid bytes → U+FFFD."""
    name = encoding or detect_encoding(data[:SAMPLE_SIZE], complete=len(data) <= SAMPLE_SIZE)
    return _normalise_newlines(codecs.decode(data, name, errors="replace"))


def read_text(path: Path, encoding: str | None = None) -> str:
    """Read and decode a whole file (for formats whose parser needs all the text at once)."""
    return "".join(iter_decoded(path, encoding))
