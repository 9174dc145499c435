"""The bench's default corpus, built from real documents: at least 50 files of the text formats,
one of them over 300 pages; and, in formats/ and scans/, slides, sheets, CSV, e-books, e-mail
and a scanned book (formats.py), which only `kops bench formats` ingests.

The source is a folder holding the project's reference documents (`shared/corpus`: the Rust book
as a 580-page PDF, the Rust Reference as one HTML page, a file of licence texts). The book's PDF
is taken whole; the Reference is cut at its chapters into groups written as HTML, Markdown, DOCX
and PDF; the licences are cut into plain-text files. No two files share text, so the embedding
cache cannot flatter the figures. The build is deterministic and is kept in the output folder
with a manifest, so later runs reuse it.
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax import saxutils

import docx
from selectolax.lexbor import LexborHTMLParser

CORPUS_VERSION = 2  # 2: formats/ and scans/ (formats.py)
FORMATS = ("html", "md", "docx", "pdf")
SOURCE_FILES = ("rustbook.pdf", "reference.html", "licenses.txt")
TEXT_PARTS = 10  # plain-text files cut from the licences


@dataclass(frozen=True)
class Block:
    kind: str  # "h1".."h6", "p", "pre", "li"
    text: str


@dataclass(frozen=True)
class Chapter:
    title: str
    html: str
    blocks: tuple[Block, ...]

    @property
    def size(self) -> int:
        return sum(len(b.text) for b in self.blocks)


def find_source(start: Path | None = None) -> Path | None:
    """`shared/corpus` beside the project (or any folder above `start`), if it is there."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "shared" / "corpus"
        if all((candidate / name).is_file() for name in SOURCE_FILES):
            return candidate
    return None


def build(source: Path, out: Path, *, groups_per_format: int = 12) -> Path:
    """Write the corpus into `out` (reused when a complete build of this version is there)."""
    missing = [name for name in SOURCE_FILES if not (source / name).is_file()]
    if missing:
        raise SystemExit(
            f"{source} lacks {', '.join(missing)}: give the folder of the project's reference "
            "documents (shared/corpus) with --source, or your own documents with --corpus"
        )
    manifest = out / "manifest.json"
    wanted = {"version": CORPUS_VERSION, "groups_per_format": groups_per_format}
    if manifest.is_file():
        saved = json.loads(manifest.read_text())
        if {k: saved.get(k) for k in wanted} == wanted:
            return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files: list[str] = []
    shutil.copyfile(source / "rustbook.pdf", out / "rust-book.pdf")
    files.append("rust-book.pdf")
    chapters = reference_chapters((source / "reference.html").read_bytes())
    groups = balanced_groups(chapters, groups_per_format * len(FORMATS))
    for number, group in enumerate(groups):
        fmt = FORMATS[number % len(FORMATS)]
        name = f"reference-{number + 1:02d}.{fmt}"
        WRITERS[fmt](out / name, group)
        files.append(name)
    text = (source / "licenses.txt").read_text(encoding="utf-8", errors="replace")
    for number, part in enumerate(split_paragraphs(text, TEXT_PARTS)):
        name = f"licenses-{number + 1:02d}.txt"
        (out / name).write_text(part, encoding="utf-8")
        files.append(name)
    from knowledgeops.lab.bench import formats  # noqa: PLC0415 (it needs the parsers' writers)

    phrases = formats.build(source, out, groups)
    files.extend(phrases)
    manifest.write_text(json.dumps({**wanted, "files": files, "phrases": phrases}, indent=2))
    return out


# --- reading the Reference -------------------------------------------------------------------

_KINDS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "pre", "blockquote", "table"}


def reference_chapters(data: bytes) -> list[Chapter]:
    """The Reference's sections: each h1 or h2 of the page's <main> with what follows it."""

    main = LexborHTMLParser(data).css_first("main")
    if main is None:
        raise SystemExit("reference.html has no <main>: not the mdBook print page expected")
    chapters: list[Chapter] = []
    title: str | None = None
    html: list[str] = []
    blocks: list[Block] = []
    for node in main.iter():
        if node.tag in {"h1", "h2"}:
            if title is not None and blocks:
                chapters.append(Chapter(title, "".join(html), tuple(blocks)))
            title, html, blocks = node.text(strip=True), [], []
        if title is None:
            continue
        html.append(node.html or "")
        blocks.extend(_blocks(node))
    if title is not None and blocks:
        chapters.append(Chapter(title, "".join(html), tuple(blocks)))
    return chapters


def _blocks(node: Any) -> Iterator[Block]:
    tag = node.tag
    if tag in {"ul", "ol"}:
        for item in node.css("li"):
            text = " ".join(item.text(separator=" ").split())
            if text:
                yield Block("li", text)
    elif tag in _KINDS:
        text = node.text(separator="" if tag == "pre" else " ")
        text = text.strip("\n") if tag == "pre" else " ".join(text.split())
        if text.strip():
            yield Block("p" if tag in {"blockquote", "table"} else tag, text)
    elif tag == "div":
        for child in node.iter():
            yield from _blocks(child)


def balanced_groups(chapters: Sequence[Chapter], count: int) -> list[list[Chapter]]:
    """At most `count` runs of consecutive sections, each closed once the text so far reaches
    its share of the whole."""
    count = max(1, min(count, len(chapters)))
    total = sum(c.size for c in chapters)
    groups: list[list[Chapter]] = [[]]
    filled = 0
    for chapter in chapters:
        if groups[-1] and filled >= total * len(groups) / count and len(groups) < count:
            groups.append([])
        groups[-1].append(chapter)
        filled += chapter.size
    return groups


def split_paragraphs(text: str, count: int) -> list[str]:
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    size = sum(len(p) for p in paragraphs) / max(1, count)
    parts: list[list[str]] = [[]]
    filled = 0
    for paragraph in paragraphs:
        if parts[-1] and filled >= size * len(parts) and len(parts) < count:
            parts.append([])
        parts[-1].append(paragraph)
        filled += len(paragraph)
    return ["\n\n".join(part) + "\n" for part in parts]


# --- writers ---------------------------------------------------------------------------------


def write_html(path: Path, group: Sequence[Chapter]) -> None:

    body = "\n".join(c.html for c in group)
    path.write_text(
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(group[0].title)}</title></head>\n<body><main>\n{body}\n</main></body></html>\n",
        encoding="utf-8",
    )


def write_markdown(path: Path, group: Sequence[Chapter]) -> None:
    lines: list[str] = []
    for block in (b for c in group for b in c.blocks):
        if block.kind.startswith("h"):
            lines.append("#" * int(block.kind[1]) + " " + block.text)
        elif block.kind == "pre":
            lines.append("```rust\n" + block.text + "\n```")
        elif block.kind == "li":
            lines.append("- " + block.text)
        else:
            lines.append(block.text)
    path.write_text("\n\n".join(lines) + "\n", encoding="utf-8")


def write_docx(path: Path, group: Sequence[Chapter]) -> None:

    document = docx.Document()
    for block in (b for c in group for b in c.blocks):
        text = _xml_safe(block.text)
        if block.kind.startswith("h"):
            document.add_heading(text, level=min(int(block.kind[1]), 9))
        elif block.kind == "li":
            document.add_paragraph(text, style="List Bullet")
        else:
            document.add_paragraph(text)
    document.save(str(path))


def write_pdf(path: Path, group: Sequence[Chapter]) -> None:

    from reportlab.lib.pagesizes import A4  # noqa: PLC0415 (reportlab: the bench extra, only to build PDFs)
    from reportlab.lib.styles import getSampleStyleSheet  # noqa: PLC0415 (reportlab: the bench extra, only to build PDFs)
    from reportlab.platypus import (  # noqa: PLC0415 (reportlab: the bench extra, only to build PDFs)
        Paragraph,
        Preformatted,
        SimpleDocTemplate,
    )

    styles = getSampleStyleSheet()
    story: list[Any] = []
    for block in (b for c in group for b in c.blocks):
        text = _latin(block.text)
        if block.kind.startswith("h"):
            story.append(
                Paragraph(saxutils.escape(text), styles[f"Heading{min(int(block.kind[1]), 6)}"])
            )
        elif block.kind == "pre":
            story.append(Preformatted(text, styles["Code"]))
        elif block.kind == "li":
            story.append(Paragraph("• " + saxutils.escape(text), styles["BodyText"]))
        else:
            story.append(Paragraph(saxutils.escape(text), styles["BodyText"]))
    SimpleDocTemplate(str(path), pagesize=A4, title=group[0].title, invariant=1).build(story)


def _xml_safe(text: str) -> str:
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def _latin(text: str) -> str:
    """What the PDF's standard fonts can draw (they have no glyphs beyond Latin-1)."""
    return _xml_safe(text).encode("latin-1", "replace").decode("latin-1")


WRITERS = {"html": write_html, "md": write_markdown, "docx": write_docx, "pdf": write_pdf}
