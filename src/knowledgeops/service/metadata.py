"""Document metadata given at upload, and the filters a search puts on documents.

Metadata is a JSON object of at most MAX_KEYS keys (letters, digits, `_`, `-`, `.`; at most 64
characters) whose values are JSON scalars (strings of at most MAX_STRING characters, numbers,
true/false, null), at most MAX_BYTES in all: enough to say where a document comes from, small
enough to sit in every document's row. A search filters on it by equality or `in`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from knowledgeops.errors import InvalidField
from knowledgeops.ingest.index.filters import Scalar, SearchFilter
from knowledgeops.ingest.parsers.base import ContentType

MAX_KEYS = 32
MAX_STRING = 1000
MAX_BYTES = 8 * 1024
MAX_FILTER_IDS = 1000
KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# what a filter's fileTypes say, and the content types they stand for
FILE_TYPES: dict[str, str] = {
    "pdf": ContentType.PDF,
    "docx": ContentType.DOCX,
    "html": ContentType.HTML,
    "md": ContentType.MARKDOWN,
    "txt": ContentType.TEXT,
    "pptx": ContentType.PPTX,
    "xlsx": ContentType.XLSX,
    "csv": ContentType.CSV,
    "epub": ContentType.EPUB,
    "eml": ContentType.EMAIL,
    "mbox": ContentType.MBOX,
    "png": ContentType.PNG,
    "jpg": ContentType.JPEG,
    "tiff": ContentType.TIFF,
    "webp": ContentType.WEBP,
    "bmp": ContentType.BMP,
}
TYPE_NAMES = {content_type: name for name, content_type in FILE_TYPES.items()}


def _bad(message: str) -> InvalidField:
    return InvalidField(f"metadata: {message}", code="invalid_metadata")


def check_scalar(value: Any, where: str) -> Scalar:
    if value is None or isinstance(value, bool | int | str):
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise _bad(f"{where} is longer than {MAX_STRING} characters")
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise _bad(f"{where} must be a string, a number, true, false or null")


def parse_metadata(raw: str | None) -> dict[str, Scalar]:
    """The metadata of an upload from its form field (a JSON object), checked; {} if absent."""
    if raw is None or not raw.strip():
        return {}
    if len(raw.encode()) > MAX_BYTES:
        raise _bad(f"it is larger than {MAX_BYTES // 1024} KB")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _bad(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _bad('it must be a JSON object, like {"team": "infra"}')
    return check_metadata(value)


def check_metadata(value: Mapping[str, Any]) -> dict[str, Scalar]:
    if len(value) > MAX_KEYS:
        raise _bad(f"at most {MAX_KEYS} keys")
    checked: dict[str, Scalar] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise _bad(f"the key {key!r} must be 1-64 letters, digits, '_', '-' or '.'")
        checked[key] = check_scalar(item, f"the value of {key!r}")
    return checked


def make_filter(
    document_ids: Sequence[str] | None,
    file_types: Sequence[str] | None,
    metadata: Mapping[str, Any] | None,
) -> SearchFilter | None:
    """The index's filter from a search's (each part optional; None when nothing is asked).
    `metadata` maps a key to a scalar (equal to it) or to {"in": [scalars]} (equal to one)."""
    if document_ids is None and file_types is None and not metadata:
        return None
    if document_ids is not None and len(document_ids) > MAX_FILTER_IDS:
        raise InvalidField(
            f"filter.documentIds: at most {MAX_FILTER_IDS} ids", code="invalid_filter"
        )
    types = None
    if file_types is not None:
        unknown = sorted(set(file_types) - set(FILE_TYPES))
        if unknown:
            raise InvalidField(
                f"filter.fileTypes: unknown {', '.join(unknown)}; the file types are "
                + ", ".join(FILE_TYPES),
                code="invalid_filter",
            )
        types = tuple(FILE_TYPES[name] for name in file_types)
    conditions = []
    for key, wanted in (metadata or {}).items():
        if not KEY.fullmatch(key):
            raise InvalidField(
                f"filter.metadata: the key {key!r} must be 1-64 letters, digits, '_', '-' or '.'",
                code="invalid_filter",
            )
        values = wanted["in"] if isinstance(wanted, Mapping) else [wanted]
        conditions.append((key, tuple(check_scalar(v, f"filter {key!r}") for v in values)))
    return SearchFilter(
        document_ids=None if document_ids is None else tuple(document_ids),
        content_types=types,
        metadata=tuple(conditions),
    )
