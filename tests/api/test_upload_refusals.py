"""Uploads the API refuses, and file names it must not trust."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from tests.api.conftest import (
    accepted,
    assert_error,
    files_under,
    runtime_of,
    upload,
    wait_completed,
)
from tests.fixtures.documents import make_gif, make_ole2, make_random_bytes, make_text

BOUNDARY = "kopsboundary7d1f"


def multipart(*parts: tuple[str, str | None, bytes]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body built by hand from (field, filename, data) parts, so that file
    names reach the server byte for byte (HTTP clients escape control characters)."""
    body = b""
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename is not None:
            body += b"Content-Type: application/octet-stream\r\n"
        body += b"\r\n" + data + b"\r\n"
    body += f"--{BOUNDARY}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def _no_jobs(client) -> None:
    assert client.get("/docs/jobs").json()["total"] == 0


def test_missing_file_field_is_400(client) -> None:
    body, headers = multipart(("datasetId", None, b"whatever"))
    response = client.post("/docs/upload", content=body, headers=headers)
    error = assert_error(response, 400, "missing_file")
    assert "'file'" in error["error"]
    _no_jobs(client)


def test_file_in_another_field_is_400(client) -> None:
    body, headers = multipart(("document", "a.txt", b"hello"))
    response = client.post("/docs/upload", content=body, headers=headers)
    assert "'file'" in assert_error(response, 400)["error"]
    _no_jobs(client)


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'{"file": "a.txt"}', "application/json"),
        (b"plain words", "text/plain"),
        (b"file=abc", "application/x-www-form-urlencoded"),
        (b"--x\r\n", "multipart/form-data"),  # no boundary
    ],
)
def test_non_multipart_body_is_400(client, content: bytes, content_type: str) -> None:
    response = client.post("/docs/upload", content=content, headers={"Content-Type": content_type})
    error = assert_error(response, 400, "not_multipart")
    assert "multipart/form-data" in error["error"]
    _no_jobs(client)


def test_two_files_are_400(client) -> None:
    body, headers = multipart(("file", "a.txt", b"one"), ("file", "b.txt", b"two"))
    response = client.post("/docs/upload", content=body, headers=headers)
    assert "one file" in assert_error(response, 400, "too_many_files")["error"]
    _no_jobs(client)
    assert files_under(runtime_of(client).settings.data_dir / "incoming") == []


def test_a_flood_of_form_fields_is_400(client) -> None:
    """Fields are small one by one; thousands of them are refused before they pile up."""
    fields = [(f"f{n}", None, b"x" * 100) for n in range(5000)]
    body, headers = multipart(*fields, ("file", "a.txt", b"one"))
    response = client.post("/docs/upload", content=body, headers=headers)
    assert "parts" in assert_error(response, 400, "too_many_parts")["error"]
    _no_jobs(client)
    assert files_under(runtime_of(client).settings.data_dir / "incoming") == []


def test_malformed_multipart_is_400(client) -> None:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    response = client.post("/docs/upload", content=b"\x00garbage", headers=headers)
    assert_error(response, 400)
    _no_jobs(client)


def test_a_body_cut_short_is_400_and_stores_nothing(client) -> None:
    body, headers = multipart(("file", "notes.txt", b"the whole text of the notes " * 50))
    cut = body[: -len(f"--{BOUNDARY}--\r\n") - 40]  # the closing boundary never arrives
    response = client.post("/docs/upload", content=cut, headers=headers)
    assert "complete" in assert_error(response, 400, "bad_multipart")["error"]
    _no_jobs(client)
    data_dir = runtime_of(client).settings.data_dir
    assert files_under(data_dir / "incoming") == []
    assert files_under(data_dir / "blobs") == []


def test_empty_file_is_400(client, tmp_path: Path) -> None:
    response = upload(client, make_text(tmp_path / "empty.txt", ""))
    assert "empty" in assert_error(response, 400, "empty_file")["error"]
    _no_jobs(client)
    data_dir = runtime_of(client).settings.data_dir
    assert files_under(data_dir / "incoming") == []
    assert files_under(data_dir / "blobs") == []


@pytest.mark.parametrize("size", [20_000, 3 * 1024 * 1024], ids=["streamed", "content-length"])
def test_too_large_is_413_and_leaves_nothing(make_client, tmp_path: Path, size: int) -> None:
    client = make_client(max_upload_mb=0.01)  # 10 KiB
    path = make_text(tmp_path / "big.txt", "x" * size)
    response = upload(client, path)
    error = assert_error(response, 413, "payload_too_large")
    assert "KOPS_MAX_UPLOAD_MB" in error["error"]
    _no_jobs(client)
    data_dir = runtime_of(client).settings.data_dir
    assert files_under(data_dir / "incoming") == []
    assert files_under(data_dir / "blobs") == []

    small = accepted(upload(client, make_text(tmp_path / "small.txt", "fits easily\n")))
    wait_completed(client, small["jobId"])  # the server is fine afterwards


@pytest.mark.parametrize(
    ("maker", "name", "phrase"),
    [
        (make_gif, "picture.gif", "GIF image"),
        (make_gif, "disguised.pdf", "GIF image"),
        (make_random_bytes, "blob.bin", "binary data"),
        (make_ole2, "old.doc", ".doc"),
    ],
)
def test_unsupported_types_are_415(client, tmp_path: Path, maker, name: str, phrase: str) -> None:
    path = maker(tmp_path / name)
    response = upload(client, path)
    error = assert_error(response, 415, "unsupported_media_type")
    assert phrase in error["error"]
    assert "supported: PDF (scanned too), Word (.docx), PowerPoint (.pptx)" in error["error"]
    _no_jobs(client)
    data_dir = runtime_of(client).settings.data_dir
    assert files_under(data_dir / "incoming") == []
    assert files_under(data_dir / "blobs") == []


def test_unknown_dataset_is_404_and_stores_nothing(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "text\n")
    missing = "00000000-0000-4000-8000-000000000000"
    assert_error(upload(client, path, dataset_id=missing), 404, "dataset_not_found")
    assert_error(upload(client, path, dataset_field=missing), 404, "dataset_not_found")
    _no_jobs(client)
    assert files_under(runtime_of(client).settings.data_dir / "blobs") == []


def test_malformed_dataset_id_is_refused(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "text\n")
    by_query = upload(client, path, dataset_id="not-a-uuid")
    error = assert_error(by_query, 422, "validation_error")
    assert "datasetId" in error["error"]
    assert error["fields"][0]["field"] == "datasetId"
    by_field = upload(client, path, dataset_field="../etc")
    error = assert_error(by_field, 422, "validation_error")
    assert "datasetId" in error["error"]
    assert error["fields"][0]["field"] == "datasetId"
    _no_jobs(client)
    assert files_under(runtime_of(client).settings.data_dir / "incoming") == []


def _assert_clean_name(name: str, extension: str) -> None:
    assert "/" not in name
    assert "\\" not in name
    assert not any(unicodedata.category(c) == "Cc" for c in name), repr(name)
    assert 0 < len(name) <= 255
    assert name.endswith(extension), name


@pytest.mark.parametrize(
    ("raw", "extension", "expected"),
    [
        ("../../etc/passwd.txt", ".txt", "passwd.txt"),
        ("..\\..\\windows\\system32\\evil.md", ".md", "evil.md"),
        ("/abs/path/report.txt", ".txt", "report.txt"),
        ("bell\x07esc\x1b[31mred\x7f\x01.txt", ".txt", "bellesc[31mred.txt"),
        ("tab\there.txt", ".txt", "tabhere.txt"),
        ("nul\x00byte.txt", ".txt", "nulbyte.txt"),
        ("", ".txt", "upload.txt"),
        ("../..", ".txt", "upload.txt"),
        ("n" * 496 + ".txt", ".txt", None),
        ("../" * 100 + "d" * 400 + ".md", ".md", None),
    ],
    ids=[
        "dotdot",
        "backslashes",
        "absolute",
        "controls",
        "tab",
        "nul",
        "empty",
        "only-dots",
        "500-chars",
        "long-path",
    ],
)
def test_file_names_are_sanitised(client, raw: str, extension: str, expected: str | None) -> None:
    text = f"Sanitised name test for {raw[-12:]!r}: kumquat.\n".encode()
    body, headers = multipart(("file", raw, text))
    response = client.post("/docs/upload", content=body, headers=headers)
    created = accepted(response)
    job = wait_completed(client, created["jobId"])
    document = client.get(f"/docs/documents/{created['documentId']}").json()
    for name in (job["fileName"], document["fileName"]):
        _assert_clean_name(name, extension)
        if expected is not None:
            assert name == expected
    assert document["fileName"] == job["fileName"]
    dataset = job["datasetId"]
    hits = client.post(f"/datasets/{dataset}/search", json={"query": "kumquat"}).json()
    assert hits["results"][0]["fileName"] == job["fileName"]

    data_dir = runtime_of(client).settings.data_dir
    stem = job["fileName"].rsplit(".", 1)[0][:20]
    for path in data_dir.rglob("*"):
        assert stem not in path.name, path
        if path.is_file() and path.parent.name != data_dir.name:
            assert data_dir / "blobs" in path.parents, path
    assert not (data_dir.parent / "etc").exists()
    assert not (data_dir / "etc").exists()


def test_a_storage_failure_is_503_not_the_clients_fault(client, tmp_path: Path) -> None:
    incoming = runtime_of(client).blobs.incoming
    incoming.rmdir()
    incoming.write_text("a file where the upload folder should be")  # a real filesystem fault
    try:
        response = upload(client, make_text(tmp_path / "a.txt", "some text to store"))
        assert_error(response, 503, "storage_unavailable")
        assert response.headers["Retry-After"] == "30"
        _no_jobs(client)
    finally:
        incoming.unlink()
        incoming.mkdir()
    assert accepted(upload(client, make_text(tmp_path / "b.txt", "now it works")))
