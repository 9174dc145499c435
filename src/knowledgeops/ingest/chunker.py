"""Chunking by the embedding model's own tokenizer: every chunk fits the model, none cuts a word.

Blocks of one section are joined and cut into windows of at most `size` tokens. A window ends
at the best boundary in its second half (a paragraph break, then a sentence end, then a space,
then next to a CJK character, as CJK has no spaces between words) and the next window starts
about `overlap` tokens earlier, again on a word boundary. Text is read section by section through
a bounded buffer, so a long document is never tokenised whole.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Tokenizer as _Tokenizer

from knowledgeops.ingest.parsers.base import Block

BUFFER_CHARS = 24_000  # chars tokenised at a time; the tail is carried over to the next buffer
_SENTENCE_END = frozenset(".!?;:。！？；…")


class Encoding(Protocol):
    tokens: list[str]
    offsets: list[tuple[int, int]]


class Tokenizer(Protocol):
    def encode(self, text: str) -> Encoding: ...


@dataclass(frozen=True, slots=True)
class ChunkDraft:
    ordinal: int
    text: str
    token_count: int
    page_start: int | None
    page_end: int | None
    section: str | None

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


class HFTokenizer:
    """Adapter for a Hugging Face `tokenizers.Tokenizer`: no special tokens, no truncation."""

    def __init__(self, tokenizer: object) -> None:

        assert isinstance(tokenizer, _Tokenizer)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def encode(self, text: str) -> Encoding:
        return self._tokenizer.encode(text, add_special_tokens=False)  # type: ignore[return-value]


class TokenChunker:
    def __init__(self, tokenizer: Tokenizer, *, size: int, overlap: int) -> None:
        if size < 8:
            raise ValueError("chunk size must be at least 8 tokens")
        if not 0 <= overlap < size // 2:
            raise ValueError("overlap must be less than half the chunk size")
        self.tokenizer = tokenizer
        self.size = size
        self.overlap = overlap

    def chunk(self, blocks: Iterable[Block]) -> Iterator[ChunkDraft]:
        ordinal = 0
        for section, pieces in itertools.groupby(blocks, key=lambda block: block.section):
            for draft in self._chunk_section(section, pieces, ordinal):
                ordinal = draft.ordinal + 1
                yield draft

    def _chunk_section(
        self, section: str | None, pieces: Iterable[Block], first_ordinal: int
    ) -> Iterator[ChunkDraft]:
        buffer = _Buffer()
        ordinal = first_ordinal
        for block in pieces:
            buffer.add(block)
            if buffer.length >= BUFFER_CHARS:
                carry_from = yield from self._emit(buffer, section, ordinal, final=False)
                ordinal += carry_from[1]
                buffer = buffer.tail(carry_from[0])
        yield from self._emit(buffer, section, ordinal, final=True)

    def _emit(
        self, buffer: _Buffer, section: str | None, ordinal: int, *, final: bool
    ) -> Generator[ChunkDraft, None, tuple[int, int]]:
        """Yield the buffer's chunks; when not final, keep the last window (and what follows it)
        for the next buffer. Returns (char offset to carry from, chunks yielded)."""
        text = buffer.text
        if not text.strip():
            return len(text), 0
        encoding = self.tokenizer.encode(text)
        offsets, tokens = encoding.offsets, encoding.tokens
        windows = list(self._windows(text, offsets, tokens))
        if not final and len(windows) > 1:
            windows, carry = windows[:-1], offsets[windows[-1][0]][0]
        elif not final:
            return 0, 0
        else:
            carry = len(text)
        for n, (start, end) in enumerate(windows):
            begin, finish = offsets[start][0], offsets[end - 1][1]
            yield ChunkDraft(
                ordinal=ordinal + n,
                text=text[begin:finish],
                token_count=end - start,
                page_start=buffer.page_at(begin),
                page_end=buffer.page_at(max(begin, finish - 1)),
                section=section,
            )
        return carry, len(windows)

    def _windows(
        self, text: str, offsets: Sequence[tuple[int, int]], tokens: Sequence[str]
    ) -> Iterator[tuple[int, int]]:
        n = len(offsets)
        start = 0
        while start < n:
            if n - start <= self.size:
                yield start, n
                return
            end = self._best_boundary(
                text, offsets, tokens, start + self.size // 2, start + self.size
            )
            yield start, end
            start = self._overlap_start(text, offsets, tokens, end, start)

    def _best_boundary(
        self,
        text: str,
        offsets: Sequence[tuple[int, int]],
        tokens: Sequence[str],
        low: int,
        high: int,
    ) -> int:
        """The boundary in (low, high] with the strongest level, the latest on a tie."""
        best, best_level = high, -1
        for i in range(high, low, -1):
            level = _level(text, offsets, tokens, i)
            if level > best_level:
                best, best_level = i, level
                if level == 5:
                    break
        return best

    def _overlap_start(
        self,
        text: str,
        offsets: Sequence[tuple[int, int]],
        tokens: Sequence[str],
        end: int,
        previous_start: int,
    ) -> int:
        if self.overlap == 0:
            return end
        target = max(end - self.overlap, previous_start + 1)
        for i in range(target, end):  # the earliest word boundary at or after the target
            if _level(text, offsets, tokens, i) >= 2:
                return i
        return end


def _level(text: str, offsets: Sequence[tuple[int, int]], tokens: Sequence[str], i: int) -> int:
    """How good a place it is to cut before token i: 5 paragraph break, 4 sentence end, 3 space,
    2 next to a CJK character (CJK has no spaces between words), 1 between two tokens of one
    space-delimited word, 0 inside a word piece. Cuts below 2 happen only when a window has no
    better place (one "word" longer than half a chunk, such as a URL or a base64 blob)."""
    if tokens[i].startswith("##"):
        return 0
    prev_end, start = offsets[i - 1][1], offsets[i][0]
    gap = text[prev_end:start]
    last = text[prev_end - 1] if prev_end > 0 else ""
    if "\n\n" in gap:
        return 5
    if last in _SENTENCE_END and (gap or _is_cjk(last)):
        return 4
    if gap and not gap.strip():
        return 3
    first = text[start] if start < len(text) else ""
    if _is_cjk(first) or _is_cjk(last):
        return 2
    return 1


def _is_cjk(char: str) -> bool:
    if not char:
        return False
    code = ord(char)
    return (
        0x3000 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x2FA1F
    )


class _Buffer:
    """Text of consecutive blocks joined by blank lines, remembering where each page starts."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.starts: list[int] = []
        self.pages: list[int | None] = []
        self._text: str | None = None

    def add(self, block: Block) -> None:
        if not block.text.strip():
            return
        if self.parts:
            self.parts.append("\n\n")
            self.length += 2
        self.starts.append(self.length)
        self.pages.append(block.page)
        self.parts.append(block.text)
        self.length += len(block.text)
        self._text = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = "".join(self.parts)
            self.parts = [self._text] if self._text else []
        return self._text

    def page_at(self, offset: int) -> int | None:
        index = bisect.bisect_right(self.starts, offset) - 1
        return self.pages[max(index, 0)] if self.pages else None

    def tail(self, offset: int) -> _Buffer:
        """A new buffer holding this one's text from `offset` on, pages kept."""
        rest = _Buffer()
        text = self.text[offset:]
        if not text:
            return rest
        index = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        rest.parts = [text]
        rest.length = len(text)
        rest.starts = [0] + [s - offset for s in self.starts[index + 1 :]]
        rest.pages = self.pages[index:]
        return rest
