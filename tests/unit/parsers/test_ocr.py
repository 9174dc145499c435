"""OCR of scanned PDF pages and images, with the real engine on pages rendered from real text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers import ocr
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.isolated import IsolatedParsing
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.progress import OcrProgress, listening
from knowledgeops.ingest.parsers.registry import parse
from tests.fixtures.documents import make_random_bytes
from tests.fixtures.scans import (
    degrade,
    make_scanned_text_pdf,
    noise_image,
    page_images,
    save_images,
)

PAGES = [
    "The harbour master keeps the tide tables.\nShips wait for the evening flood.",
    "Barnacles grow on the hull of the old ferry.\nThe kelp forest shelters young cod.",
]


def read(path: Path, content_type: str) -> tuple[list[Block], list[OcrProgress]]:
    events: list[OcrProgress] = []
    with listening(events.append):
        blocks = list(parse(path, content_type))
    return blocks, events


def words(text: str) -> set[str]:
    return {w.strip(".,").lower() for w in text.split()}


def test_a_scanned_pdf_is_read_page_by_page_with_progress(tmp_path: Path) -> None:
    pdf = make_scanned_text_pdf(tmp_path / "scan.pdf", page_images(tmp_path, PAGES))
    blocks, events = read(pdf, ContentType.PDF)
    assert [b.page for b in blocks] == [1, 2]
    for block, truth in zip(blocks, PAGES, strict=True):
        assert words(block.text) == words(truth), block.text
    assert [(e.done, e.total, e.page, e.low) for e in events] == [
        (0, 2, None, False),
        (1, 2, 1, False),
        (2, 2, 2, False),
    ]
    assert all(e.confidence is not None and e.confidence > 0.9 for e in events[1:])


def test_a_mixed_pdf_runs_ocr_on_its_scanned_pages_only(tmp_path: Path) -> None:
    pdf = make_scanned_text_pdf(
        tmp_path / "mixed.pdf",
        page_images(tmp_path, PAGES),
        text_pages={2: "A born-digital page about copper kettles."},
    )
    blocks, events = read(pdf, ContentType.PDF)
    assert [b.page for b in blocks] == [1, 2, 3]
    assert blocks[1].text == "A born-digital page about copper kettles."
    assert [(e.total, e.page) for e in events] == [(2, None), (2, 1), (2, 3)]


@pytest.mark.parametrize("image_format", ["TIFF", "PNG", "JPEG"])
def test_images_and_degraded_multi_page_tiffs_are_read(tmp_path: Path, image_format: str) -> None:
    scans = [degrade(image, seed=n) for n, image in enumerate(page_images(tmp_path, PAGES))]
    path = save_images(tmp_path / f"scan.{image_format.lower()}", scans, image_format)
    content_type = {"TIFF": ContentType.TIFF, "PNG": ContentType.PNG, "JPEG": ContentType.JPEG}
    blocks, events = read(path, content_type[image_format])
    expected = PAGES if image_format == "TIFF" else PAGES[:1]
    assert [b.page for b in blocks] == list(range(1, len(expected) + 1))
    for block, truth in zip(blocks, expected, strict=True):
        found = words(block.text)
        assert len(found & words(truth)) >= len(words(truth)) - 1, block.text
    assert events[-1].done == events[-1].total == len(expected)


def test_a_strip_of_one_line_is_read_and_detected_on_a_copy_padded_to_four_to_one(
    tmp_path: Path,
) -> None:
    """A line cut from a page (1,654 × 54 px, its copy for detection 960 × 31): the detector
    scales an image up until its short side is 736 px, so unpadded it would have worked on
    22,800 × 736 (a mutated JPEG of 160 × 32,816 took four minutes in the fuzz tests)."""
    (page,) = page_images(tmp_path, [PAGES[0].splitlines()[0]])
    grey = np.asarray(page)
    inked = np.flatnonzero((grey < 128).any(axis=1))
    strip = save_images(
        tmp_path / "strip.png", [page.crop((0, inked[0] - 12, page.width, inked[-1] + 12))], "PNG"
    )
    (block,), _ = read(strip, ContentType.PNG)
    assert words(block.text) == words(PAGES[0].splitlines()[0])
    wide = ocr._padded(np.full((5, 960, 3), 200, dtype=np.uint8))
    assert wide.shape == (240, 960, 3)
    assert (wide == 200).all()  # the background's colour
    tall = np.zeros((960, 7, 3), dtype=np.uint8)
    tall[:, :, 0] = 9
    assert ocr._padded(tall).shape == (960, 240, 3)
    assert (ocr._padded(tall)[:, 7:] == (9, 0, 0)).all()
    page_sized = np.zeros((960, 700, 3), dtype=np.uint8)
    assert ocr._padded(page_sized) is page_sized


def test_a_page_read_unsurely_is_flagged_and_not_indexed(tmp_path: Path) -> None:
    images = [*page_images(tmp_path, PAGES[:1]), noise_image()]
    pdf = make_scanned_text_pdf(tmp_path / "noisy.pdf", images)
    blocks, events = read(pdf, ContentType.PDF)
    assert [b.page for b in blocks] == [1]
    (noisy,) = [e for e in events if e.page == 2]
    assert noisy.low
    assert noisy.confidence is not None
    assert noisy.confidence < 0.8
    alone = save_images(tmp_path / "noise.png", [noise_image()], "PNG")
    with pytest.raises(PermanentError) as caught:
        read(alone, ContentType.PNG)
    assert caught.value.code == "no_text_found"
    assert "legible" in caught.value.message


def test_oversized_and_damaged_images_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    Image.new("L", (3000, 2000), 255).save(big)
    with (
        parse_limits.using(ParseLimits(max_image_pixels=5_000_000)),
        pytest.raises(UserActionRequired) as caught,
    ):
        read(big, ContentType.PNG)
    assert caught.value.code == "image_too_large"
    assert "KOPS_MAX_IMAGE_PIXELS" in caught.value.message
    broken = tmp_path / "broken.png"
    broken.write_bytes(big.read_bytes()[:300])
    with pytest.raises(PermanentError) as damaged:
        read(broken, ContentType.PNG)
    assert damaged.value.code == "corrupt_file"
    with pytest.raises(PermanentError) as junk:
        read(make_random_bytes(tmp_path / "x.tiff"), ContentType.TIFF)
    assert junk.value.code == "corrupt_file"


def test_ocr_progress_crosses_the_parser_process(tmp_path: Path) -> None:
    from knowledgeops.ingest.chunker import HFTokenizer  # noqa: PLC0415
    from knowledgeops.ingest.embedders.local import load_tokenizer  # noqa: PLC0415
    from knowledgeops.ingest.prepare import ChunkSpec  # noqa: PLC0415

    pdf = make_scanned_text_pdf(tmp_path / "scan.pdf", page_images(tmp_path, PAGES))
    parsing = IsolatedParsing(ParseLimits())
    events: list[OcrProgress] = []
    spec = ChunkSpec(size=64, overlap=8, max_text_chars=100_000, max_chunks=100)
    try:
        stream = parsing.chunks(
            pdf, ContentType.PDF, spec, HFTokenizer(load_tokenizer()), events.append
        )
        drafts = list(stream)
    finally:
        parsing.close()
    assert "harbour master" in " ".join(d.text for d in drafts).lower()
    assert min(d.page_start or 0 for d in drafts) == 1
    assert max(d.page_end or 0 for d in drafts) == 2
    assert [(e.done, e.total) for e in events] == [(0, 2), (1, 2), (2, 2)]
