"""Fuzzing every parser and the chunker with hypothesis: any bytes give either chunks or a
classified error (a `JobError` with a code and a message), never another exception, a crash or
a hang (each example has a deadline).

Inputs: random bytes, and valid documents of each format mutated (bytes flipped, cut, inserted,
repeated); for the ZIP formats (DOCX, PPTX, XLSX, EPUB) also valid packages whose XML parts are
mutated, so the XML readers are reached. The outcomes are counted and printed
(`pytest -s tests/fuzz`).

Short in CI (KOPS_FUZZ_EXAMPLES, default 150 per format); a long run:
    KOPS_FUZZ_EXAMPLES=5000 pytest -s tests/fuzz
"""

from __future__ import annotations

import io
import os
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from knowledgeops.errors import JobError
from knowledgeops.ingest.chunker import HFTokenizer, TokenChunker
from knowledgeops.ingest.clean import clean_blocks
from knowledgeops.ingest.embedders.local import load_tokenizer
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.registry import parse
from tests.fixtures.documents import make_docx, make_html, make_markdown, make_pdf, make_text
from tests.fixtures.office import (
    make_csv,
    make_eml,
    make_epub,
    make_mbox,
    make_pptx,
    make_xlsx,
    simple_message,
)

EXAMPLES = int(os.environ.get("KOPS_FUZZ_EXAMPLES", "150"))
DEADLINE_MS = 10_000  # per example: a parse that takes longer is a hang
LIMITS = ParseLimits(max_text_chars=2_000_000, max_chunks=5_000)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=DEADLINE_MS,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI") == "true",  # the same examples in every CI run
)
OUTCOMES: dict[str, Counter[str]] = {}


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return HFTokenizer(load_tokenizer())


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("seeds")
    return {
        ContentType.PDF: make_pdf(
            root / "s.pdf", ["A first page about tides.", "Second page, harbours."]
        ).read_bytes(),
        ContentType.DOCX: make_docx(root / "s.docx").read_bytes(),
        ContentType.HTML: make_html(root / "s.html").read_bytes(),
        ContentType.MARKDOWN: make_markdown(root / "s.md").read_bytes(),
        ContentType.TEXT: make_text(
            root / "s.txt", "Plain text.\n\nCafé crème, 中文.\n"
        ).read_bytes(),
        ContentType.PPTX: make_pptx(root / "s.pptx").read_bytes(),
        ContentType.XLSX: make_xlsx(root / "s.xlsx").read_bytes(),
        ContentType.CSV: make_csv(
            root / "s.csv", [["Name", "Note"], ["Zoë", 'a "quoted", value'], ["中文", "x\ny"]]
        ).read_bytes(),
        ContentType.EPUB: make_epub(root / "s.epub").read_bytes(),
        ContentType.EMAIL: make_eml(root / "s.eml").read_bytes(),
        ContentType.MBOX: make_mbox(
            root / "s.mbox",
            [
                simple_message("One", "First body."),
                simple_message("Two", "<p>Second</p>", html=True),
            ],
        ).read_bytes(),
        # small images of a word (OCR of a whole page would take seconds an example)
        ContentType.PNG: _word_image("PNG"),
        ContentType.TIFF: _word_image("TIFF"),
        ContentType.JPEG: _word_image("JPEG"),
    }


def _word_image(image_format: str) -> bytes:
    image = Image.new("L", (160, 48), 255)
    ImageDraw.Draw(image).text((8, 14), "Harbour 42", fill=0)
    buffer = io.BytesIO()
    image.save(buffer, image_format)
    return buffer.getvalue()


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 64))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif op == "repeat":
            piece = data[at : at + draw(st.integers(1, 256))]
            data[at:at] = piece * draw(st.integers(1, 20))
        elif op == "truncate":
            del data[at:]
    return bytes(data)


def package_with_part(seed: bytes, part: str, xml: bytes) -> bytes:
    """The seed package with `part` replaced (a valid ZIP around broken XML)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(seed)) as original, zipfile.ZipFile(out, "w") as archive:
        for item in original.infolist():
            data = xml if item.filename == part else original.read(item.filename)
            archive.writestr(item.filename, data)
    return out.getvalue()


def run_one(
    tmp_path: Path, tokenizer: HFTokenizer, content_type: str, data: bytes, tally: Counter[str]
) -> None:
    """Parse, clean and chunk `data`; the only exception allowed out is a `JobError`."""
    path = tmp_path / "fuzzed"
    path.write_bytes(data)
    chunker = TokenChunker(tokenizer, size=64, overlap=8)
    error: JobError | None = None
    try:
        with parse_limits.using(LIMITS):
            drafts = list(chunker.chunk(clean_blocks(parse(path, content_type))))
    except JobError as exc:
        error, drafts = exc, []
    if error is not None:
        assert error.code
        assert error.message.strip()
        tally[f"error:{error.code}"] += 1
        return
    for draft in drafts:
        assert draft.text.strip()
        assert 0 < draft.token_count <= 64
    tally["chunks" if drafts else "no text"] += 1


def _tally(name: str) -> Counter[str]:
    return OUTCOMES.setdefault(name, Counter())


NAMES = {
    ContentType.PDF: "pdf",
    ContentType.DOCX: "docx",
    ContentType.HTML: "html",
    ContentType.MARKDOWN: "markdown",
    ContentType.TEXT: "text",
    ContentType.PPTX: "pptx",
    ContentType.XLSX: "xlsx",
    ContentType.CSV: "csv",
    ContentType.EPUB: "epub",
    ContentType.EMAIL: "eml",
    ContentType.MBOX: "mbox",
    ContentType.PNG: "png",
    ContentType.TIFF: "tiff",
    ContentType.JPEG: "jpeg",
}
FORMATS = list(NAMES)
# the XML part of each package format that its parser reads most of
PACKAGE_PARTS = [
    (ContentType.DOCX, "word/document.xml"),
    (ContentType.PPTX, "ppt/slides/slide2.xml"),
    (ContentType.PPTX, "ppt/presentation.xml"),
    (ContentType.XLSX, "xl/worksheets/sheet1.xml"),
    (ContentType.XLSX, "xl/workbook.xml"),
    (ContentType.EPUB, "OEBPS/content.opf"),
    (ContentType.EPUB, "OEBPS/text/chapter2.xhtml"),
]


@pytest.mark.parametrize("content_type", FORMATS, ids=NAMES.get)
def test_mutated_documents_give_chunks_or_a_classified_error(
    content_type: str,
    seeds: dict[str, bytes],
    tokenizer: HFTokenizer,
    tmp_path: Path,
) -> None:
    tally = _tally(f"mutated {NAMES[content_type]}")

    @FUZZ
    @given(data=mutated(seeds[content_type]))
    def check(data: bytes) -> None:
        run_one(tmp_path, tokenizer, content_type, data, tally)

    check()
    _report(tally)


@pytest.mark.parametrize("content_type", FORMATS, ids=NAMES.get)
def test_random_bytes_give_chunks_or_a_classified_error(
    content_type: str, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    tally = _tally(f"random {NAMES[content_type]}")

    @FUZZ
    @given(data=st.binary(max_size=4096))
    def check(data: bytes) -> None:
        run_one(tmp_path, tokenizer, content_type, data, tally)

    check()
    _report(tally)


@pytest.mark.parametrize(("content_type", "part"), PACKAGE_PARTS, ids=[p for _, p in PACKAGE_PARTS])
def test_packages_with_mutated_xml_give_chunks_or_a_classified_error(
    content_type: str, part: str, seeds: dict[str, bytes], tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    with zipfile.ZipFile(io.BytesIO(seeds[content_type])) as package:
        xml = package.read(part)
    tally = _tally(f"{NAMES[content_type]} {part}")

    @FUZZ
    @given(data=mutated(xml))
    def check(data: bytes) -> None:
        run_one(
            tmp_path,
            tokenizer,
            content_type,
            package_with_part(seeds[content_type], part, data),
            tally,
        )

    check()
    _report(tally)


@FUZZ
@given(
    texts=st.lists(st.text(max_size=3000), min_size=1, max_size=6),
    sections=st.lists(st.none() | st.text(max_size=40), min_size=1, max_size=6),
    size=st.integers(16, 254),
    data=st.data(),
)
def test_the_chunker_takes_any_text(
    tokenizer: HFTokenizer,
    texts: list[str],
    sections: list[str | None],
    size: int,
    data: st.DataObject,
) -> None:
    """Any text, any sections, any legal size and overlap: every chunk fits the model, ordinals
    run 0…n-1, and the same input gives the same chunks."""
    overlap = data.draw(st.integers(0, size // 2 - 1))
    blocks = [Block(t, section=sections[i % len(sections)]) for i, t in enumerate(texts)]
    chunker = TokenChunker(tokenizer, size=size, overlap=overlap)
    drafts = list(chunker.chunk(clean_blocks(blocks)))
    assert [d.ordinal for d in drafts] == list(range(len(drafts)))
    for draft in drafts:
        assert draft.text.strip()
        assert 0 < draft.token_count <= size
    assert list(chunker.chunk(clean_blocks(blocks))) == drafts


def _report(tally: Counter[str]) -> None:
    name = next(n for n, t in OUTCOMES.items() if t is tally)
    shown = ", ".join(f"{k} {v}" for k, v in tally.most_common())
    print(f"\n[fuzz] {name}: {sum(tally.values())} examples: {shown}")
