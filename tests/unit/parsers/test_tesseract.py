"""OCR in a language the bundled engine does not read goes to Tesseract (a Debian package:
.ci/run installs tesseract-ocr and tesseract-ocr-deu; skipped locally without it, a failure in
CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledgeops.errors import UserActionRequired
from knowledgeops.ingest.parsers import tesseract
from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.ocr import available_languages, using_languages
from knowledgeops.ingest.parsers.progress import OcrProgress, listening
from knowledgeops.ingest.parsers.registry import parse
from tests.conftest import unavailable
from tests.fixtures.scans import make_scanned_text_pdf, page_images

GERMAN = "Die Größe der Straße überrascht.\nÄrzte prüfen täglich die Übersicht."


@pytest.fixture
def german_tesseract() -> None:
    if "de" not in tesseract.available_languages():
        unavailable(
            "Tesseract with German data is not installed (apt-get install tesseract-ocr-deu)"
        )


def test_a_language_beyond_the_bundled_models_is_read_by_tesseract(
    german_tesseract: None, tmp_path: Path
) -> None:
    pdf = make_scanned_text_pdf(tmp_path / "de.pdf", page_images(tmp_path, [GERMAN]))
    events: list[OcrProgress] = []
    with listening(events.append), using_languages(["de"]):
        (block,) = list(parse(pdf, ContentType.PDF))
    assert block.text.split() == GERMAN.split()
    assert events[-1].confidence is not None
    assert events[-1].confidence > 0.8
    assert {"en", "zh", "de"} <= available_languages()


def test_a_language_without_its_data_needs_the_operator(tmp_path: Path) -> None:
    pdf = make_scanned_text_pdf(tmp_path / "x.pdf", page_images(tmp_path, [GERMAN]))
    with using_languages(["hi"]), pytest.raises(UserActionRequired) as caught:
        list(parse(pdf, ContentType.PDF))
    if "hi" in tesseract.available_languages():
        pytest.skip("Tesseract has Hindi data here")
    assert caught.value.code == "ocr_unavailable"
    assert "tesseract-ocr-hin" in caught.value.message


def test_cjk_words_are_joined_without_spaces_and_latin_words_with() -> None:
    tsv = (
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
        "5\t1\t1\t1\t1\t1\t0\t0\t10\t10\t95\t日本\n"
        "5\t1\t1\t1\t1\t2\t0\t0\t10\t10\t93\t語です\n"
        "5\t1\t1\t1\t2\t1\t0\t0\t10\t10\t91\tHello\n"
        "5\t1\t1\t1\t2\t2\t0\t0\t10\t10\t20\tzzkx\n"
        "5\t1\t1\t1\t2\t3\t0\t0\t10\t10\t90\tworld\n"
    )
    page = tesseract._page(tsv)
    assert page.text == "日本語です\nHello world"
    assert page.confidence is not None
    assert 0.7 < page.confidence < 0.9  # the unsure word counts against the page
