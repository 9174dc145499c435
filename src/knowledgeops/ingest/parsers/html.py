"""HTML via selectolax's lexbor engine: page chrome removed, headings become the section path."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser, LexborNode

from knowledgeops.errors import UserActionRequired
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.encoding import (
    SAMPLE_SIZE,
    bom_encoding,
    codec_name,
    decode_bytes,
    detect_encoding,
)
from knowledgeops.ingest.parsers.limits import MB
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.sections import (
    LINE,
    PARAGRAPH,
    SectionBuilder,
    table_cell,
    table_lines,
)

META_SCAN_BYTES = 4096
"""How far into the file a <meta charset> is looked for."""

# Elements whose whole subtree is never text for a reader.
SKIP_TAGS = frozenset(
    {
        "script",
        "style",
        "noscript",
        "template",
        "svg",
        "canvas",
        "iframe",
        "nav",
        "aside",
        "form",
        "button",
        "head",
        "title",
        "meta",
        "link",
        "object",
        "embed",
        "select",
        "textarea",
        "input",
        "video",
        "audio",
        "map",
        "dialog",
        "frameset",
        "noframes",
    }
)

# Subtrees hidden from readers or marked as site chrome by their attributes.
SKIP_SELECTOR = ", ".join(
    (
        "[hidden]",
        '[aria-hidden="true"]',
        '[role="navigation"]',
        '[role="banner"]',
        '[role="contentinfo"]',
        '[role="search"]',
        '[role="complementary"]',
        '[style*="display:none"]',
        '[style*="display: none"]',
        '[role="menu"]',
        '[role="menubar"]',
        # navigation that generators mark by class: DocBook's header and footer tables and its
        # table of contents, Sphinx's toctree, breadcrumbs anywhere
        '[class~="navheader"]',
        '[class~="navfooter"]',
        'table[summary^="Navigation"]',
        '[class~="toc"]',
        '[class~="toctree-wrapper"]',
        '[class~="breadcrumb"]',
        '[class~="breadcrumbs"]',
    )
)

# A list or table whose text is mostly the text of its links is navigation (a table of
# contents, a menu, a row of "previous | up | next"), whatever its class says.
LINK_LISTS = "ul, ol, dl, menu, table"
MIN_NAV_LINKS = 3
NAV_LINK_SHARE = 0.8

# A header/footer inside one of these belongs to the content; outside, it is page chrome.
SECTIONING = frozenset({"article", "main", "section", "aside", "nav"})

# Block-level elements and the separator their boundaries put into the text.
PARAGRAPH_TAGS = frozenset(
    {
        "address",
        "article",
        "blockquote",
        "body",
        "center",
        "details",
        "div",
        "dl",
        "fieldset",
        "figure",
        "footer",
        "header",
        "hgroup",
        "hr",
        "html",
        "main",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "ul",
        "menu",
    }
)
LINE_TAGS = frozenset(
    {
        "li",
        "dd",
        "dt",
        "tr",
        "caption",
        "figcaption",
        "summary",
        "legend",
        "option",
        "thead",
        "tbody",
        "tfoot",
    }
)
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
CELLS = frozenset({"td", "th"})
MAX_COLSPAN = 64  # columns one cell may span in a Markdown row (HTML allows 1000)

_META_CHARSET = re.compile(
    rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE
)
_ANCHOR_MARKS = "¶§#🔗"
_WHATWG_ALIASES = {
    # The HTML standard reads these labels as Windows-1252 and UTF-16 declarations as UTF-8.
    "iso8859-1": "cp1252",
    "ascii": "cp1252",
    "utf-16": "utf-8",
    "utf-16-le": "utf-8",
    "utf-16-be": "utf-8",
}


def html_encoding(head: bytes, *, complete: bool = False) -> str:
    """The encoding of an HTML file: BOM, then <meta charset>, then detection from the bytes.

    `head` is the start of the file (64 KiB is plenty); `complete` says it is the whole file.
    """
    bom = bom_encoding(head)
    if bom is not None:
        return bom
    match = _META_CHARSET.search(head[:META_SCAN_BYTES])
    if match is not None:
        name = codec_name(match.group(1).decode("ascii", "replace"))
        if name is not None:
            return _WHATWG_ALIASES.get(name, name)
    return detect_encoding(head, complete=complete)


def _strength(current: str, new: str) -> str:
    return new if len(new) > len(current) else current


class _Extractor:
    """Walks the DOM once, depth first, and turns it into section blocks."""

    def __init__(self, skip_ids: set[int]) -> None:
        self.skip_ids = skip_ids
        self.out = SectionBuilder()
        self.ready: list[Block] = []
        self.parts: list[str] = []
        self.pending = ""
        self.prefix = ""
        self.pre_depth = 0
        self.cell_depth = 0
        self.sectioning_depth = 0
        self.tables: list[list[list[str]]] = []  # the rows of each open table, cells as text
        self.lists: list[int | None] = []  # next number for each open list (None: bullets)

    # -- text collection ---------------------------------------------------------------------
    def _flush(self) -> None:
        if not self.parts:
            return
        if self.cell_depth:
            return  # a cell's text is taken when the cell ends
        text = " ".join("".join(self.parts).split())
        self.parts = []
        if not text.strip():
            return
        text = self.prefix + text
        self.prefix = ""
        self._emit(text)

    def _emit(self, text: str) -> None:
        self.ready.extend(self.out.add(text, self.pending or LINE))
        self.pending = ""

    def _boundary(self, separator: str) -> None:
        if self.cell_depth:
            self.parts.append(" ")
            return
        self._flush()
        self.pending = _strength(self.pending, separator)

    def _end_cell(self, span: int) -> None:
        """A cell of the open table's last row ends: its text becomes the row's next cell (a
        cell outside any <tr>, or a table outside any <table>, is text like any other)."""
        text = table_cell("".join(self.parts))
        self.parts = []
        if self.tables and self.tables[-1]:
            self.tables[-1][-1].extend([text] + [""] * (span - 1))
        elif text:
            self._emit(text)

    # -- the walk ----------------------------------------------------------------------------
    def walk(self, root: LexborNode) -> Iterator[Block]:
        if root.tag in SECTIONING:
            self.sectioning_depth = 1  # a header inside <main>/<article> is content, not chrome
        stack: list[LexborNode] = []
        node = root.child
        while node is not None:
            if self._enter(node):
                first = node.child
                if first is not None:
                    stack.append(node)
                    node = first
                    continue
                self._leave(node)
            following = node.next
            while following is None and stack:
                parent = stack.pop()
                self._leave(parent)
                following = parent.next
            node = following
            if self.ready:
                yield from self.ready
                self.ready = []
        self._flush()
        self.ready.extend(self.out.flush())
        yield from self.ready
        self.ready = []

    def _enter(self, node: LexborNode) -> bool:
        """Handle the start of a node; True to visit its children."""
        tag = node.tag
        if tag == "-text":
            text = node.text_content
            if text:
                self.parts.append(text)
            return False
        if not tag or tag[0] in "-!#_":
            return False  # comments, doctype, processing instructions
        if tag in SKIP_TAGS or node.mem_id in self.skip_ids:
            return False
        if tag in ("header", "footer") and not self.sectioning_depth:
            return False
        if tag in SECTIONING:
            self.sectioning_depth += 1
        if self.pre_depth:
            if tag == "br":
                self.parts.append("\n")
            return True
        return self._enter_element(node, tag)

    def _enter_element(self, node: LexborNode, tag: str) -> bool:
        level = HEADINGS.get(tag)
        if level is not None and not self.cell_depth:
            self._flush()
            self.pending = ""
            title = node.text(deep=True).strip().rstrip(_ANCHOR_MARKS).strip()
            self.ready.extend(self.out.heading(level, title))
            return False
        if tag == "br":
            if self.cell_depth:
                self.parts.append(" ")
            else:
                self._flush()
                self.pending = _strength(self.pending, LINE)
            return False
        if tag == "pre":
            self._boundary(PARAGRAPH)
            if not self.cell_depth:
                self.pre_depth += 1
            return True
        if tag in CELLS:
            if self.cell_depth:
                self.parts.append(" ")  # a cell of a table inside a cell
            else:
                self._flush()  # text in a row but outside its cells stays before the table
            self.cell_depth += 1
            return True
        if tag == "tr":
            self._boundary(LINE)
            if self.tables and not self.cell_depth:
                self.tables[-1].append([])
            return True
        if tag == "table" and not self.cell_depth:
            self._boundary(PARAGRAPH)
            self.tables.append([])
            return True
        if tag in ("ul", "ol", "menu"):
            self._boundary(PARAGRAPH)
            self.lists.append(None if tag != "ol" else _list_start(node))
            return True
        if tag == "li":
            self._boundary(LINE)
            if not self.cell_depth:
                number = self.lists[-1] if self.lists else None
                if number is None:
                    self.prefix = "- "
                else:
                    self.prefix = f"{number}. "
                    self.lists[-1] = number + 1
            return True
        if tag in PARAGRAPH_TAGS:
            self._boundary(PARAGRAPH)
        elif tag in LINE_TAGS:
            self._boundary(LINE)
        return True

    def _leave(self, node: LexborNode) -> None:
        tag = node.tag
        if tag is None:
            return
        if tag in SECTIONING:
            self.sectioning_depth -= 1
        if tag == "pre" and self.pre_depth:
            self.pre_depth -= 1
            if not self.pre_depth:
                code = "".join(self.parts).strip("\n")
                self.parts = []
                if code.strip():
                    self.pending = _strength(self.pending, PARAGRAPH)
                    self._emit(code)
                self.pending = PARAGRAPH
            return
        if self.pre_depth:
            return
        if tag in CELLS:
            self.cell_depth -= 1
            if not self.cell_depth:
                self._end_cell(_colspan(node))
        elif tag == "tr":
            self._boundary(LINE)
        elif tag == "table" and not self.cell_depth and self.tables:
            rows = self.tables.pop()
            self._boundary(PARAGRAPH)
            lines = table_lines(rows)
            if lines:
                self._emit(LINE.join(lines))
            self.pending = PARAGRAPH
        elif tag in ("ul", "ol", "menu"):
            if self.lists:
                self.lists.pop()
            self._boundary(PARAGRAPH)
        elif tag == "li":
            self._boundary(LINE)
            self.prefix = ""
        elif tag in PARAGRAPH_TAGS:
            self._boundary(PARAGRAPH)
        elif tag in LINE_TAGS:
            self._boundary(LINE)


def _colspan(node: LexborNode) -> int:
    """The columns a cell spans (1 when absent or unreadable; at most MAX_COLSPAN)."""
    value = node.attributes.get("colspan")
    try:
        return max(1, min(int(value), MAX_COLSPAN)) if value else 1
    except ValueError:
        return 1


def _list_start(node: LexborNode) -> int:
    start = node.attributes.get("start")
    try:
        return int(start) if start else 1
    except ValueError:
        return 1


def _content_root(tree: LexborHTMLParser) -> LexborNode | None:
    """<main> if there is one, else a single <article>, else <body>; one with text in it."""
    body = tree.body
    candidates: list[LexborNode] = []
    main = tree.css_first("main")
    if main is not None:
        candidates.append(main)
    articles = tree.css("article")
    if len(articles) == 1:
        candidates.append(articles[0])
    for candidate in candidates:
        if candidate.text(deep=True).strip():
            return candidate
    return body if body is not None else tree.root


def extract_blocks(tree: LexborHTMLParser, title: str | None = None) -> Iterator[Block]:
    """Blocks of readable text of a parsed HTML document, one or more per section; `title` (an
    e-book's chapter title) heads the section path of every block."""
    root = _content_root(tree)
    if root is None:
        return
    skip_ids = {node.mem_id for node in root.css(SKIP_SELECTOR)}
    skip_ids.update(node.mem_id for node in root.css(LINK_LISTS) if _is_navigation(node))
    extractor = _Extractor(skip_ids)
    if title:
        extractor.ready.extend(extractor.out.heading(0, title))
    yield from extractor.walk(root)


def parse_html_bytes(
    data: bytes, title: str | None = None, encoding: str | None = None
) -> Iterator[Block]:
    """The blocks of an HTML page held in memory (an e-book's chapter, an e-mail's HTML part),
    in `encoding` when it is known (an e-mail part's charset), else found as for a file."""
    if encoding is None:
        encoding = html_encoding(data[:SAMPLE_SIZE], complete=len(data) <= SAMPLE_SIZE)
    tree = LexborHTMLParser(data if encoding == "utf-8" else decode_bytes(data, encoding))
    return extract_blocks(tree, title)


def _is_navigation(node: LexborNode) -> bool:
    """Most of the text of this list or table is in its links (at least MIN_NAV_LINKS)."""
    links = node.css("a[href]")
    if len(links) < MIN_NAV_LINKS:
        return False
    total = len("".join(node.text(deep=True).split()))
    linked = sum(len("".join(link.text(deep=True).split())) for link in links)
    return total == 0 or linked >= NAV_LINK_SHARE * total


class HtmlParser:
    """HTML and XHTML pages."""

    content_type = ContentType.HTML

    def parse(self, path: Path) -> Iterator[Block]:
        most = current_limits().max_html_bytes
        size = path.stat().st_size
        if size > most:
            raise UserActionRequired(
                f"The HTML page is {size / MB:,.1f} MB; this server parses pages of at most "
                f"{most / MB:g} MB (KOPS_MAX_HTML_MB), since a page is parsed whole. Split it, "
                "or save the article's text alone.",
                code="html_too_large",
            )
        yield from parse_html_bytes(path.read_bytes())
