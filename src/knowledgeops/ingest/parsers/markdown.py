"""Markdown via markdown-it-py: headings become the section path, markup is removed."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.encoding import read_text
from knowledgeops.ingest.parsers.sections import LINE, PARAGRAPH, SectionBuilder

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
_FRONT_MATTER_SCAN = 16 * 1024
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_HTML_TAG = re.compile(r"</?[A-Za-z][^>]*>")


def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def strip_front_matter(text: str) -> str:
    """Remove a YAML front-matter block ("---" … "---") at the very start of a document."""
    if not text.startswith("---"):
        return text
    match = _FRONT_MATTER.match(text[:_FRONT_MATTER_SCAN])
    return text[match.end() :] if match else text


def _inline_text(token: Token) -> str:
    parts: list[str] = []
    for child in token.children or ():
        kind = child.type
        if kind in ("text", "code_inline"):
            parts.append(child.content)
        elif kind == "softbreak":
            parts.append(" ")
        elif kind == "hardbreak":
            parts.append("\n")
        elif kind == "image":
            parts.append(child.content)
    return "".join(parts).strip()


def _html_text(html: str) -> str:
    text = _HTML_TAG.sub(" ", _HTML_COMMENT.sub(" ", html))
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


class _Renderer:
    """Walks the flat markdown-it token stream and feeds a SectionBuilder."""

    def __init__(self) -> None:
        self.out = SectionBuilder()
        # One entry per open list: the next item number (None for bullet lists).
        self.lists: list[int | None] = []
        self.item_prefix: str | None = None
        self.list_lines = 0
        self.row: list[str] | None = None
        self.table_rows = 0

    def _separator(self) -> str:
        return LINE if self.lists and self.list_lines else PARAGRAPH

    def render(self, tokens: Sequence[Token]) -> Iterator[Block]:
        i = 0
        while i < len(tokens):
            token = tokens[i]
            kind = token.type
            if kind == "heading_open":
                title = _inline_text(tokens[i + 1]) if i + 1 < len(tokens) else ""
                yield from self.out.heading(int(token.tag[1:]), title)
                i += 3  # heading_open, inline, heading_close
                continue
            yield from self._handle(token)
            i += 1
        yield from self.out.flush()

    def _handle(self, token: Token) -> list[Block]:
        kind = token.type
        if kind in ("bullet_list_open", "ordered_list_open"):
            start = token.attrGet("start")
            self.lists.append(
                None if kind == "bullet_list_open" else int(start) if start is not None else 1
            )
            if len(self.lists) == 1:
                self.list_lines = 0
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
        elif kind == "list_item_open":
            indent = "  " * (len(self.lists) - 1)
            number = self.lists[-1] if self.lists else None
            if number is None:
                self.item_prefix = indent + "- "
            else:
                self.item_prefix = f"{indent}{number}. "
                self.lists[-1] = number + 1
        elif kind == "tr_open":
            self.row = []
        elif kind == "tr_close":
            cells, self.row = self.row or [], None
            separator = LINE if self.table_rows else PARAGRAPH
            self.table_rows += 1
            return self.out.add(" | ".join(cells), separator)
        elif kind == "table_open":
            self.table_rows = 0
        elif kind == "inline":
            return self._text(_inline_text(token))
        elif kind in ("fence", "code_block"):
            return self._text(token.content.rstrip("\n"), verbatim=True)
        elif kind == "html_block":
            return self._text(_html_text(token.content))
        return []

    def _text(self, text: str, *, verbatim: bool = False) -> list[Block]:
        if self.row is not None:
            self.row.append(" ".join(text.split()))
            return []
        if not text.strip():
            return []
        if self.lists:
            indent = "  " * len(self.lists)
            if self.item_prefix is not None:
                text = self.item_prefix + text
                self.item_prefix = None
            elif not verbatim:
                text = indent + text
            blocks = self.out.add(text, self._separator())
            self.list_lines += 1
            return blocks
        return self.out.add(text, PARAGRAPH)


class MarkdownParser:
    """Markdown (CommonMark plus tables and strikethrough)."""

    content_type = ContentType.MARKDOWN

    def parse(self, path: Path) -> Iterator[Block]:
        source = strip_front_matter(read_text(path))
        tokens = _markdown().parse(source)
        del source
        yield from _Renderer().render(tokens)
