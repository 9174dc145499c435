"""From a stored file's blocks to chunk drafts: clean, count pages, enforce the text and chunk
limits, chunk. One function, run in the parser's child process next to the parser (so the
worker's thread, and the API's threads beside it, never spend CPU or the GIL on it) or inline."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

from knowledgeops.errors import UserActionRequired
from knowledgeops.ingest.chunker import ChunkDraft, TokenChunker, Tokenizer
from knowledgeops.ingest.clean import clean_blocks
from knowledgeops.ingest.parsers.base import Block


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    size: int  # tokens per chunk
    overlap: int  # tokens shared by neighbours
    max_text_chars: int  # KOPS_MAX_TEXT_CHARS
    max_chunks: int  # KOPS_MAX_CHUNKS_PER_DOCUMENT
    first_page: int | None = None  # a page range of a PDF (one part of a split document) …
    last_page: int | None = None  # … both from 1, inclusive
    ocr_languages: tuple[str, ...] = ("en", "zh")  # the dataset's: what OCR reads scans in

    @property
    def pages(self) -> tuple[int, int] | None:
        if self.first_page is None or self.last_page is None:
            return None
        return self.first_page, self.last_page


def prepare(
    blocks: Iterable[Block], tokenizer: Tokenizer, spec: ChunkSpec
) -> Generator[ChunkDraft, None, int | None]:
    """The document's chunk drafts, streaming; returns the last page number seen (or None)."""
    pages = _PageCounter()
    cleaned = _text_limit(pages.count(clean_blocks(blocks)), spec.max_text_chars)
    chunker = TokenChunker(tokenizer, size=spec.size, overlap=spec.overlap)
    yield from _chunk_limit(chunker.chunk(cleaned), spec.max_chunks)
    return pages.last


class ChunkStream:
    """Drafts to iterate once; `pages` is the document's last page number afterwards."""

    def __init__(self, drafts: Generator[ChunkDraft, None, int | None]) -> None:
        self._drafts = drafts
        self.pages: int | None = None

    def __iter__(self) -> Iterator[ChunkDraft]:
        self.pages = yield from self._drafts

    def close(self) -> None:
        self._drafts.close()


class _PageCounter:
    def __init__(self) -> None:
        self.last: int | None = None

    def count(self, blocks: Iterable[Block]) -> Iterator[Block]:
        for block in blocks:
            if block.page is not None:
                self.last = max(self.last or 0, block.page)
            yield block


def _text_limit(blocks: Iterable[Block], most: int) -> Iterator[Block]:
    """Stop a document whose text passes `most` characters (KOPS_MAX_TEXT_CHARS)."""
    seen = 0
    for block in blocks:
        seen += len(block.text)
        if seen > most:
            raise UserActionRequired(
                f"The document holds more than {most:,} characters of text "
                "(KOPS_MAX_TEXT_CHARS). Split it into smaller documents.",
                code="text_too_long",
            )
        yield block


def _chunk_limit(drafts: Iterable[ChunkDraft], most: int) -> Iterator[ChunkDraft]:
    """The drafts, failing at the first past `most` (KOPS_MAX_CHUNKS_PER_DOCUMENT)."""
    for count, draft in enumerate(drafts, start=1):
        if count > most:
            raise UserActionRequired(
                f"The document makes more than {most:,} chunks (KOPS_MAX_CHUNKS_PER_DOCUMENT). "
                "Split it into smaller documents.",
                code="too_many_chunks",
            )
        yield draft
