"""Text cleaning between parsing and chunking.

`clean_blocks` is the entry point: it strips repeated page headers/footers from paged blocks
(`RepeatedLineStripper`), then normalises each block's text (`clean_text`), and drops blocks that
end up empty. Everything is streaming: blocks go in and come out in order, a few pages at a time.

The rules are deliberately conservative: text is searched and shown to people, so a missed join
costs little while a wrong one (code glued into prose, a table row into a sentence) costs more.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Iterator

from knowledgeops.ingest.parsers.base import Block

# Control characters (Cc) except \t and \n, plus invisible characters that only get in the way.
_DROP: dict[int, str | None] = {
    code: None
    for code in (*range(0x00, 0x09), 0x0B, *range(0x0E, 0x20), *range(0x7F, 0xA0))
    if code not in (0x0A, 0x0D)
}
_DROP.update({0x00AD: None, 0x200B: None, 0xFEFF: None, 0xFFFE: None, 0xFFFF: None})
_DROP.update({0x09: " ", 0x0C: "\n", 0x85: "\n", 0x2028: "\n", 0x2029: "\n"})
# Lone surrogates (a byte a decoder kept with surrogateescape) are no characters: no encoder,
# tokenizer or database takes them. Each becomes U+FFFD, as a decoder that replaces would give.
_DROP.update(dict.fromkeys(range(0xD800, 0xE000), "\ufffd"))

# "exam-\nple": a letter, a hyphen at the line end, optional indentation, a lowercase letter.
_HYPHENATED = re.compile(r"([^\W\d_])-\n[ \t]*(?=[^\W\d_])")
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}")
_TRAILING_SPACES = re.compile(r"[ \t]+$", re.MULTILINE)
_MANY_NEWLINES = re.compile(r"\n{3,}")

# Lines that must stay lines.
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•▪◦‣–—]\s|\d{1,3}[.)]\s|[a-zA-Z][.)]\s|\(\w{1,3}\)\s)")
_CODE_LINE = re.compile(
    r"^(?: {4}|\t)"  # indented code
    r"|[{}]|;\s*$|=>|->|::|==|!=|&&|\|\|"  # typical code punctuation
    r"|^\s*(?:#|//|/\*|\*/|\$ |>>> |```)"  # comments, prompts, fences, markdown headings
)
_TABLE_ROW = re.compile(r" \| |^\s*\|")
_SENTENCE_END = re.compile(r"[.!?:;…。！？：；]['\"’”)\]]*$")
_MIN_WRAPPED_LINE = 40


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.translate(_DROP)


def _dehyphenate(text: str) -> str:
    def join(match: re.Match[str]) -> str:
        following = text[match.end()]
        if following.islower():
            return match.group(1)
        return match.group(0)

    return _HYPHENATED.sub(join, text)


def _collapse_spaces(text: str) -> str:
    """Runs of spaces/tabs inside a line become one space; leading indentation is kept."""
    text = _INNER_SPACES.sub(" ", text)
    return _TRAILING_SPACES.sub("", text)


def _is_structural(line: str) -> bool:
    return bool(_LIST_ITEM.match(line) or _CODE_LINE.search(line) or _TABLE_ROW.search(line))


def _continues(previous: str, line: str) -> bool:
    """Whether `line` continues the paragraph `previous` was hard-wrapped from."""
    if not previous or not line or previous[0].isspace() or line[0].isspace():
        return False  # indented lines are code, verse or layout: keep them as they are
    if _is_structural(previous) or _is_structural(line):
        return False
    if _SENTENCE_END.search(previous):
        return False
    first = line[0]
    if first.islower():
        return previous[-1].isalnum() or previous[-1] in ",)'\"’”-"
    # An upper-case or numeric start continues only a long line that stops mid-phrase
    # ("… used by\nRust programmers"), never a short one (a heading or a label).
    return (
        (first.isupper() or first.isdigit())
        and len(previous) >= _MIN_WRAPPED_LINE
        and (previous[-1].isalpha() or previous[-1] == ",")
    )


def _join_wrapped_lines(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    for line in lines:
        if out and _continues(out[-1], line):
            out[-1] = f"{out[-1]} {line}"
        else:
            out.append(line)
    return "\n".join(out)


def clean_text(text: str) -> str:
    """Normalise one block's text for chunking and search (see the module docstring).

    NFC; control characters removed (tab → space); "exam-\\nple" → "example" when a lowercase
    letter follows; runs of spaces collapsed (indentation kept); trailing spaces removed;
    hard-wrapped prose lines joined (never code, list items or table rows); at most one blank line
    in a row; no blank lines at either end.
    """
    text = _normalise(text)
    if "-\n" in text:
        text = _dehyphenate(text)
    text = _collapse_spaces(text)
    text = _join_wrapped_lines(text)
    text = _MANY_NEWLINES.sub("\n\n", text)
    return text.strip("\n") if text.strip() else ""


_DIGITS = re.compile(r"\d+")
_MAX_NUMBERS = 4

# How one number in a running header/footer behaves from page to page: the same value everywhere
# ("const", 2025), or the page number plus a fixed offset ("offset", 0) as in "Page 3 of 10".
NumberRule = tuple[str, int]
EdgePattern = tuple[NumberRule, ...]


EdgeKey = tuple[str, str]
"""("top" or "bottom", the line with whitespace collapsed and digit runs replaced by "#")."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Edge:
    index: int  # line index in the page text
    key: EdgeKey
    numbers: tuple[int, ...]  # the digit runs' values, in order


def _matches(pattern: EdgePattern, numbers: tuple[int, ...], page: int) -> bool:
    for (rule, value), number in zip(pattern, numbers, strict=True):
        if (number if rule == "const" else number - page) != value:
            return False
    return True


class RepeatedLineStripper:
    """Removes running headers and footers from a stream of paged blocks.

    An edge line is one of the first `edge_lines` (top) or last `edge_lines` (bottom) non-empty
    lines of a page. Edge lines are compared with digit runs replaced by "#" ("Page 3 of 10" ~
    "Page 4 of 10") and only with edge lines on the same side (top or bottom). Each number must
    behave like a running header's: the same on every page, or the page number plus a fixed
    offset (so "Step 1"/"Step 7" at the tops of two pages do not count as a header). Lines without
    a letter or digit ("}") and code-looking lines ("fn main() {") are never taken for headers:
    in code-heavy documents they often start or end pages.

    The stripper holds a window of `window` pages; a page leaves the window when a newer page
    pushes it out (or at `flush`). It then loses each edge line that occurs in the same form on at
    least half of the pages in the window, and on at least `min_pages` of them, or in a form found
    repeated like this earlier in the document. Blocks without a page number are never stripped
    but keep their place in the order.
    """

    def __init__(self, window: int = 8, *, edge_lines: int = 2, min_pages: int = 3) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.edge_lines = edge_lines
        self.min_pages = min_pages
        self.repeated: dict[EdgeKey, set[EdgePattern]] = {}
        """Learned running lines: key → the number patterns seen for it."""
        self._buffer: deque[tuple[Block, list[_Edge]]] = deque()
        self._seen: dict[EdgeKey, list[tuple[int, tuple[int, ...]]]] = {}
        self._pages = 0

    def _edges(self, block: Block) -> list[_Edge]:
        if block.page is None:
            return []
        lines = block.text.split("\n")
        visible = [i for i, line in enumerate(lines) if line.strip()]
        n = self.edge_lines
        top, bottom = visible[:n], visible[-n:]  # on a short page, a line may be both
        edges = []
        for side, indexes in (("top", top), ("bottom", bottom)):
            for i in indexes:
                line = " ".join(lines[i].split())
                if not any(ch.isalnum() for ch in line) or _CODE_LINE.search(line):
                    continue
                numbers = tuple(int(d) for d in _DIGITS.findall(line))
                edges.append(_Edge(i, (side, _DIGITS.sub("#", line)), numbers))
        return edges

    def feed(self, block: Block) -> list[Block]:
        """Take the next block; return the blocks (earlier ones, in order) that are now final."""
        edges = self._edges(block)
        self._buffer.append((block, edges))
        if block.page is not None:
            self._pages += 1
            for key in {edge.key for edge in edges}:
                numbers = next(edge.numbers for edge in edges if edge.key == key)
                self._seen.setdefault(key, []).append((block.page, numbers))
        released: list[Block] = []
        while self._buffer and (self._pages >= self.window or self._buffer[0][0].page is None):
            released.append(self._release())
        return released

    def flush(self) -> list[Block]:
        """The end of the stream: release every block still held."""
        return [self._release() for _ in range(len(self._buffer))]

    def _learn(self, edge: _Edge, page: int) -> None:
        seen = self._seen.get(edge.key, [])
        threshold = max(self.min_pages, (self._pages + 1) // 2)  # half the window, rounded up
        if len(seen) < threshold:
            return
        pattern = self._best_pattern(edge, page, seen)
        if sum(1 for p, numbers in seen if _matches(pattern, numbers, p)) >= threshold:
            self.repeated.setdefault(edge.key, set()).add(pattern)

    @staticmethod
    def _best_pattern(
        edge: _Edge, page: int, seen: list[tuple[int, tuple[int, ...]]]
    ) -> EdgePattern:
        """For each number of `edge`, the rule (constant or page offset) most pages agree with."""
        if len(edge.numbers) > _MAX_NUMBERS:
            return tuple(("const", number) for number in edge.numbers)
        rules: list[NumberRule] = []
        for i, number in enumerate(edge.numbers):
            const = sum(1 for _, numbers in seen if numbers[i] == number)
            offset = sum(1 for p, numbers in seen if numbers[i] - p == number - page)
            rules.append(("const", number) if const >= offset else ("offset", number - page))
        return tuple(rules)

    def _release(self) -> Block:
        block, edges = self._buffer.popleft()
        page = block.page
        if page is None:
            return block
        for edge in edges:
            self._learn(edge, page)
        for key in {edge.key for edge in edges}:
            seen = self._seen[key]
            seen.pop(0)  # this page's entry: pages leave in the order they came
            if not seen:
                del self._seen[key]
        self._pages -= 1
        drop = {
            edge.index
            for edge in edges
            if any(_matches(p, edge.numbers, page) for p in self.repeated.get(edge.key, ()))
        }
        if not drop:
            return block
        lines = block.text.split("\n")
        text = "\n".join(line for i, line in enumerate(lines) if i not in drop)
        return dataclasses.replace(block, text=text)


def strip_repeated_edges(blocks: Iterable[Block], window: int = 8) -> Iterator[Block]:
    """Blocks in order, with running page headers/footers removed (see `RepeatedLineStripper`)."""
    stripper = RepeatedLineStripper(window)
    for block in blocks:
        yield from stripper.feed(block)
    yield from stripper.flush()


def clean_blocks(blocks: Iterable[Block], window: int = 8) -> Iterator[Block]:
    """Strip running headers/footers, clean each block's text, drop blocks left empty."""
    for block in strip_repeated_edges(blocks, window):
        text = clean_text(block.text)
        if text:
            yield block if text == block.text else dataclasses.replace(block, text=text)
