"""A dataset's OCR languages: the default, a change, and a language this server cannot read."""

from __future__ import annotations

from knowledgeops.ingest.parsers import tesseract
from tests.api.conftest import assert_error, create_dataset


def test_ocr_languages_default_change_and_refusal(client) -> None:
    dataset = create_dataset(client, "scans")
    assert dataset["ocrLanguages"] == ["en", "zh"]
    chinese = create_dataset(client, "chinese scans", ocrLanguages=["zh", "zh"])
    assert chinese["ocrLanguages"] == ["zh"]
    changed = client.patch(f"/datasets/{dataset['id']}", json={"ocrLanguages": ["en"]})
    assert changed.status_code == 200, changed.text
    assert changed.json()["ocrLanguages"] == ["en"]
    missing = "hi" if "hi" not in tesseract.available_languages() else "xx"
    refused = client.post("/datasets", json={"name": "x", "ocrLanguages": ["en", missing]})
    error = assert_error(refused, 422, "unknown_ocr_language")
    assert missing in error["error"]
    assert "en, zh" in error["error"]
    bad = client.patch(f"/datasets/{dataset['id']}", json={"ocrLanguages": ["English"]})
    assert_error(bad, 422)
    assert client.get(f"/datasets/{dataset['id']}").json()["ocrLanguages"] == ["en"]
