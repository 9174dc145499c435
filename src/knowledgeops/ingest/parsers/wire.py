"""What the worker makes of the parser child's answers (child.py sends them, isolated.py reads
them): JSON messages checked field by field, and drafts checked against what was asked, whatever
the child did, since a compromised parser is not trusted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from knowledgeops.errors import ErrorCategory, JobError, PermanentError, UserActionRequired
from knowledgeops.ingest.chunker import ChunkDraft
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.progress import OcrProgress
from knowledgeops.ingest.prepare import ChunkSpec


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise unexpected()
    return message


def blocks_of(message: dict[str, Any]) -> Iterator[Block]:
    """The blocks of one message, checked: text a string, page an int or null, section a
    string or null."""
    for item in message.get("blocks", ()):
        text, page, section = item
        if not isinstance(text, str) or not (page is None or isinstance(page, int)):
            raise unexpected()
        if not (section is None or isinstance(section, str)):
            raise unexpected()
        yield Block(text=text, page=page, section=section)


def ocr_progress_of(message: dict[str, Any]) -> OcrProgress:
    """An OCR progress message, checked field by field."""
    done, total, page = message.get("done"), message.get("total"), message.get("page")
    confidence, low = message.get("confidence"), message.get("low")
    if not (type(done) is int and type(total) is int and 0 <= done <= total):
        raise unexpected()
    if not (page is None or (type(page) is int and page >= 1)) or type(low) is not bool:
        raise unexpected()
    if confidence is not None:
        if type(confidence) not in (int, float) or not 0 <= confidence <= 1:
            raise unexpected()
        confidence = float(confidence)
    return OcrProgress(done, total, page, confidence, low)


def unexpected() -> PermanentError:
    return PermanentError("the parser process answered something unexpected", code="parser_crashed")


def drafts_of(message: dict[str, Any]) -> Iterator[ChunkDraft]:
    """The chunk drafts of one message, checked field by field (the child is not trusted)."""
    items = message.get("drafts")
    if not isinstance(items, list):
        raise unexpected()
    for item in items:
        if not isinstance(item, list) or len(item) != 6:
            raise unexpected()
        ordinal, text, tokens, page_start, page_end, section = item
        valid = (
            type(ordinal) is int
            and isinstance(text, str)
            and type(tokens) is int
            and all(p is None or (type(p) is int and p >= 1) for p in (page_start, page_end))
            and (section is None or isinstance(section, str))
        )
        if not valid:
            raise unexpected()
        yield ChunkDraft(ordinal, text, tokens, page_start, page_end, section)


class DraftGuard:
    """What the worker checks itself of the drafts a child sends, whatever the child did:
    ordinals 0, 1, 2, … without a gap, token counts within the chunk size, page ranges in order
    (and within the pages asked for), and the document limits (as `prepare` raises them inline:
    a child that ignores them is stopped here)."""

    def __init__(self, spec: ChunkSpec) -> None:
        self.spec = spec
        self.count = 0
        self.chars = 0
        self.last_page = 0

    def check(self, draft: ChunkDraft) -> None:
        spec = self.spec
        if draft.ordinal != self.count or not 0 < draft.token_count <= spec.size:
            raise unexpected()
        if draft.page_start is not None and draft.page_end is not None:
            if draft.page_start > draft.page_end:
                raise unexpected()
            asked = spec.pages
            if asked is not None and not asked[0] <= draft.page_start <= draft.page_end <= asked[1]:
                raise unexpected()
            self.last_page = max(self.last_page, draft.page_end)
        self.count += 1
        self.chars += len(draft.text)
        if self.count > spec.max_chunks:
            raise UserActionRequired(
                f"The document makes more than {spec.max_chunks:,} chunks "
                "(KOPS_MAX_CHUNKS_PER_DOCUMENT). Split it into smaller documents.",
                code="too_many_chunks",
            )
        # overlap is under half a chunk, so no character is in more than two chunks
        if self.chars > 2 * spec.max_text_chars:
            raise UserActionRequired(
                f"The document holds more than {spec.max_text_chars:,} characters of text "
                "(KOPS_MAX_TEXT_CHARS). Split it into smaller documents.",
                code="text_too_long",
            )

    def pages(self, value: Any) -> int | None:
        if value is None:
            return None
        if type(value) is not int or value < max(1, self.last_page):
            raise unexpected()
        return int(value)


def job_error(message: dict[str, Any]) -> JobError:
    code, text = str(message.get("code", "parse_error")), str(message.get("message", ""))
    if message.get("category") == ErrorCategory.USER_ACTION_REQUIRED.value:
        return UserActionRequired(text, code=code)
    return PermanentError(text, code=code)
