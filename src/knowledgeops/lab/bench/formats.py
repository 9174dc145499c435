"""The bench corpus's documents of the formats users have besides text documents: slides,
sheets, CSV, e-books, e-mail with attachments, and a scanned book; and `kops bench formats`,
which ingests them through `kops serve` and checks that a phrase of every one is found.

They are written from the same real text as the rest of the corpus (the Rust Reference's
sections; the scanned book is the Rust book's pages rendered at 200 dpi into a PDF without a
text layer) into `formats/` and `scans/` beside it; the other phases leave those folders out,
so their figures stay comparable with earlier runs and with the peer.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime
from html import escape
from pathlib import Path
from typing import Any

from knowledgeops.lab.bench.corpus import Chapter, write_docx, write_markdown

FOLDERS = ("formats", "scans")
PER_FORMAT = 3
SCANNED_PAGES = 24
BULLETS_PER_SLIDE = 6


def _paragraphs(group: Sequence[Chapter]) -> list[tuple[str, str]]:
    """(heading, paragraph) of each body block of the chapters, the heading it sits under."""
    out: list[tuple[str, str]] = []
    heading = group[0].title
    for block in (b for c in group for b in c.blocks):
        if block.kind.startswith("h"):
            heading = block.text
        else:
            out.append((heading, _clean(block.text)))
    return out


def _clean(text: str) -> str:
    return "".join(ch for ch in text if ch in "\t\n" or ord(ch) >= 0x20)


def write_pptx(path: Path, group: Sequence[Chapter]) -> None:
    from pptx import Presentation  # noqa: PLC0415 (only the bench writes slides)

    deck = Presentation()
    paragraphs = _paragraphs(group)
    for start in range(0, len(paragraphs), BULLETS_PER_SLIDE):
        batch = paragraphs[start : start + BULLETS_PER_SLIDE]
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = batch[0][0]
        body = slide.placeholders[1].text_frame
        for n, (_, text) in enumerate(batch):
            paragraph = body.paragraphs[0] if n == 0 else body.add_paragraph()
            paragraph.text = text[:600]
    deck.save(str(path))


def write_xlsx(path: Path, group: Sequence[Chapter]) -> None:
    import openpyxl  # noqa: PLC0415 (only the bench writes workbooks)

    workbook = openpyxl.Workbook(write_only=True)
    for number, chapter in enumerate(group, start=1):
        sheet = workbook.create_sheet(f"{number} {chapter.title}"[:31].replace("/", " "))
        sheet.append(["Section", "Text"])
        for heading, text in _paragraphs([chapter]):
            sheet.append([heading, text[:30_000]])
    workbook.save(str(path))


def write_csv(path: Path, group: Sequence[Chapter]) -> None:
    import csv  # noqa: PLC0415

    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Section", "Text"])
        writer.writerows(_paragraphs(group))


def write_epub(path: Path, group: Sequence[Chapter]) -> None:
    files = [f"chapter{n}.xhtml" for n in range(1, len(group) + 1)]
    manifest = "".join(
        f'<item id="c{n}" href="{f}" media-type="application/xhtml+xml"/>'
        for n, f in enumerate(files, start=1)
    )
    spine = "".join(f'<itemref idref="c{n}"/>' for n in range(1, len(files) + 1))
    links = "".join(
        f'<li><a href="{f}">{escape(c.title)}</a></li>' for f, c in zip(files, group, strict=True)
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr(
            zipfile.ZipInfo("mimetype"), "application/epub+zip", compress_type=zipfile.ZIP_STORED
        )
        book.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" '
            'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
            'full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        book.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" '
            'version="3.0"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>'
            f"{escape(group[0].title)}</dc:title></metadata><manifest>{manifest}"
            '<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" '
            f'properties="nav"/></manifest><spine>{spine}</spine></package>',
        )
        book.writestr(
            "OEBPS/nav.xhtml",
            '<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops">'
            f'<body><nav epub:type="toc"><ol>{links}</ol></nav></body></html>',
        )
        for name, chapter in zip(files, group, strict=True):
            book.writestr(
                f"OEBPS/{name}",
                '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
                f"<head><title>{escape(chapter.title)}</title></head><body>{chapter.html}"
                "</body></html>",
            )


def write_eml(path: Path, group: Sequence[Chapter]) -> None:
    """A message whose body is the first section and whose attachments carry the others, as
    a Word document and a Markdown file."""
    message = EmailMessage()
    message["Subject"] = group[0].title
    message["From"] = "Reference editors <editors@example.org>"
    message["To"] = "readers@example.org"
    message["Date"] = format_datetime(dt.datetime(2024, 5, 6, 9, 30, tzinfo=dt.UTC))
    message.set_content("\n\n".join(text for _, text in _paragraphs(group[:1])))
    rest = list(group[1:]) or list(group)
    half = max(1, len(rest) // 2)
    folder = path.parent
    docx_path, md_path = folder / f".{path.stem}.docx", folder / f".{path.stem}.md"
    write_docx(docx_path, rest[:half])
    write_markdown(md_path, rest[half:] or rest)
    message.add_attachment(
        docx_path.read_bytes(),
        maintype="application",
        subtype="vnd.openxmlformats-officedocument.wordprocessingml.document",
        filename=f"{path.stem}-part1.docx",
    )
    message.add_attachment(
        md_path.read_bytes(), maintype="text", subtype="markdown", filename=f"{path.stem}-2.md"
    )
    docx_path.unlink()
    md_path.unlink()
    path.write_bytes(bytes(message))


WRITERS = {
    "pptx": write_pptx,
    "xlsx": write_xlsx,
    "csv": write_csv,
    "epub": write_epub,
    "eml": write_eml,
}


def phrase_of(text: str, words: int = 4) -> str | None:
    """`words` consecutive words of letters from the middle of `text` (a search for them finds
    the document that holds the text), or None when it has too few."""
    stripped = (w.strip(".,;:!?()[]\"'") for w in text.split())
    found = [w for w in stripped if w.isalpha() and len(w) > 3]
    if len(found) < words:
        return None
    middle = (len(found) - words) // 2
    return " ".join(found[middle : middle + words])


def build(source: Path, out: Path, groups: Sequence[Sequence[Chapter]]) -> dict[str, str]:
    """Write `formats/` (PER_FORMAT files of each format from `groups`) and `scans/` (the
    scanned book) under `out`; each file written (relative to `out`) with a phrase of its text
    that search should find."""
    from knowledgeops.lab.bench.ocr import english_pages, scanned_pdf  # noqa: PLC0415

    written: dict[str, str] = {}
    (out / "formats").mkdir()
    for n, fmt in enumerate(WRITERS):
        for k in range(PER_FORMAT):
            group = groups[(n * PER_FORMAT + k) % len(groups)]
            name = f"formats/reference-{k + 1:02d}.{fmt}"
            WRITERS[fmt](out / name, group)
            paragraphs = [text for _, text in _paragraphs(group) if phrase_of(text)]
            written[name] = (phrase_of(paragraphs[-1][:600]) or "") if paragraphs else ""
    (out / "scans").mkdir()
    pages = english_pages(source / "rustbook.pdf", SCANNED_PAGES, first=60)
    scanned_pdf([image for _, image in pages], out / "scans" / "rust-book-scanned.pdf")
    written["scans/rust-book-scanned.pdf"] = phrase_of(pages[len(pages) // 2][0]) or ""
    return written


@dataclass
class FormatsFigures:
    documents: int
    seconds: float
    by_format: dict[str, dict[str, Any]] = field(default_factory=dict)
    phrases_found: int = 0
    phrases_asked: int = 0
    missed: list[str] = field(default_factory=list)


def files_of(corpus: Path) -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (corpus / folder).glob("*") if p.is_file())


def run_formats(corpus: Path, *, workers: int = 2) -> FormatsFigures:
    """Ingest the corpus's formats/ and scans/ through a fresh `kops serve` with `workers`
    workers; per format: documents completed, chunks, when the last was done; and whether the
    phrase the corpus's manifest keeps for each file is found by keyword search."""
    from knowledgeops.lab.bench.endtoend import EmbeddedServer, connect  # noqa: PLC0415

    manifest = corpus / "manifest.json"
    phrases: dict[str, str] = (
        json.loads(manifest.read_text()).get("phrases", {}) if manifest.is_file() else {}
    )
    files = files_of(corpus)
    if not files:
        raise SystemExit(f"{corpus} has no formats/ or scans/ folder: build the corpus again")
    with (
        EmbeddedServer(workers=workers) as server,
        connect(server.url, server.started, server.log) as (client, _),
    ):
        began = time.perf_counter()
        jobs: dict[str, Path] = {}
        for path in files:
            with path.open("rb") as fh:
                answer = client.post("/docs/upload", files={"file": (path.name, fh)})
            answer.raise_for_status()
            jobs[answer.json()["jobId"]] = path
        finished: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 3600
        while len(finished) < len(jobs) and time.monotonic() < deadline:
            for job_id in set(jobs) - set(finished):
                job = client.get(f"/docs/jobs/{job_id}").json()
                if job["status"] in ("completed", "failed", "cancelled"):
                    job["seconds"] = time.perf_counter() - began
                    finished[job_id] = job
            time.sleep(1.0)
        figures = FormatsFigures(len(files), round(time.perf_counter() - began, 1))
        for job_id, path in jobs.items():
            job = finished.get(job_id, {"status": "unfinished"})
            fmt = "scanned pdf" if path.parent.name == "scans" else path.suffix.lstrip(".")
            entry = figures.by_format.setdefault(fmt, {"documents": 0, "completed": 0, "chunks": 0})
            entry["documents"] += 1
            if job["status"] != "completed":
                figures.missed.append(f"{path.name}: {job['status']} {job.get('error') or ''}")
                continue
            entry["completed"] += 1
            entry["chunks"] += job["totalChunks"] or 0
            entry["done_after_s"] = round(max(entry.get("done_after_s", 0), job["seconds"]), 1)
            phrase = phrases.get(f"{path.parent.name}/{path.name}")
            if not phrase:
                continue
            figures.phrases_asked += 1
            hits = client.post(
                f"/datasets/{job['datasetId']}/search",
                json={
                    "query": phrase,
                    "mode": "keyword",
                    "topK": 5,
                    "filter": {"documentIds": [job["documentId"]]},
                },
            ).json()["results"]
            if hits:  # the search was confined to this document
                figures.phrases_found += 1
            else:
                figures.missed.append(f"{path.name}: {phrase!r} not found")
        return figures
