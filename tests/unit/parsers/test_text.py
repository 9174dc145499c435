from __future__ import annotations

from pathlib import Path

import pytest

from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.encoding import (
    decode_bytes,
    detect_encoding,
    detect_file_encoding,
    iter_decoded,
    read_text,
)
from knowledgeops.ingest.parsers.text import (
    MAX_BLOCK_CHARS,
    TextParser,
    split_paragraph_groups,
)
from tests.fixtures.documents import CHINESE_TEXT, JAPANESE_TEXT, LATIN1_TEXT, make_text


def parse_all(path: Path) -> list[Block]:
    return list(TextParser().parse(path))


def joined(blocks: list[Block]) -> str:
    return "\n\n".join(block.text for block in blocks)


def test_utf8_text_is_parsed_verbatim(tmp_path: Path) -> None:
    text = "First paragraph, ünïcödé ✓.\nSecond line.\n\nSecond paragraph 🚀.\n"
    blocks = parse_all(make_text(tmp_path / "a.txt", text))
    assert [b.text for b in blocks] == [text.strip("\n")]
    assert blocks[0].page is None
    assert blocks[0].section is None


@pytest.mark.parametrize(
    ("text", "encoding", "bom", "expected"),
    [
        (LATIN1_TEXT, "latin-1", False, "cp1252"),
        (CHINESE_TEXT, "gb18030", False, "gb18030"),
        (CHINESE_TEXT, "gbk", False, "gb18030"),
        (JAPANESE_TEXT, "shift_jis", False, "cp932"),
        (CHINESE_TEXT, "utf-16-le", True, "utf-16"),
        (CHINESE_TEXT, "utf-16-be", True, "utf-16"),
        (LATIN1_TEXT, "utf-8", True, "utf-8-sig"),
        (CHINESE_TEXT, "utf-8", False, "utf-8"),
        (CHINESE_TEXT, "utf-32-le", True, "utf-32"),
    ],
)
def test_encodings_are_detected_and_decoded(
    tmp_path: Path, text: str, encoding: str, bom: bool, expected: str
) -> None:
    path = make_text(tmp_path / "t.txt", text, encoding=encoding, bom=bom)
    assert detect_file_encoding(path) == expected
    assert joined(parse_all(path)) == text.strip("\n")


def test_cp1252_punctuation_is_decoded(tmp_path: Path) -> None:
    text = "“Smart quotes” – dashes… and the € sign in a café.\n"
    path = make_text(tmp_path / "t.txt", text * 3, encoding="cp1252")
    assert "“Smart quotes” – dashes… and the € sign in a café." in joined(parse_all(path))


def test_crlf_and_cr_line_ends_become_newlines(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"one\r\ntwo\rthree\r\n\r\nfour")
    assert joined(parse_all(path)) == "one\ntwo\nthree\n\nfour"


def test_undecodable_bytes_are_replaced_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    # 100 KiB of clean UTF-8 (the sample decides UTF-8), then a stray invalid byte.
    path.write_bytes(("ascii text line\n" * 6400).encode() + b"bad \xff byte\n")
    assert detect_file_encoding(path) == "utf-8"
    text = joined(parse_all(path))
    assert "bad \ufffd byte" in text


def test_streaming_decode_matches_whole_decode_at_any_piece_boundary(tmp_path: Path) -> None:
    text = (CHINESE_TEXT + "line\r\nnext\r\n") * 50
    for encoding, bom in (("gb18030", False), ("utf-16-le", True), ("utf-8", False)):
        path = make_text(tmp_path / f"t-{encoding}.txt", text, encoding=encoding, bom=bom)
        expected = text.replace("\r\n", "\n")
        for piece_size in (1, 3, 7, 4096):
            pieces = list(iter_decoded(path, piece_size=piece_size))
            assert "".join(pieces) == expected, (encoding, piece_size)
            assert all(pieces)
        assert read_text(path) == expected


def test_large_file_is_cut_into_bounded_blocks_at_blank_lines(tmp_path: Path) -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * (20 + i % 50) for i in range(3000)]
    text = "\n\n".join(paragraphs) + "\n"
    path = make_text(tmp_path / "big.txt", text)
    assert path.stat().st_size > 500_000
    blocks = parse_all(path)
    assert len(blocks) > 20
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)
    # Cut only between paragraphs: every block starts with a paragraph and nothing is lost.
    assert all(b.text.startswith("Paragraph ") for b in blocks)
    assert joined(blocks) == text.strip("\n")


def test_text_without_blank_lines_is_cut_at_line_ends() -> None:
    lines = [f"line {i} " + "x" * 60 for i in range(2000)]
    groups = list(split_paragraph_groups(["\n".join(lines)], target=4000, limit=8000))
    assert len(groups) > 10
    assert all(len(g) <= 8000 for g in groups)
    assert "\n".join(groups) == "\n".join(lines)


def test_text_without_any_break_is_cut_hard_at_the_limit() -> None:
    groups = list(split_paragraph_groups(["y" * 25_000], target=4000, limit=8000))
    assert [len(g) for g in groups] == [8000, 8000, 8000, 1000]


def test_blank_file_yields_nothing(tmp_path: Path) -> None:
    assert parse_all(make_text(tmp_path / "e.txt", "")) == []
    assert parse_all(make_text(tmp_path / "w.txt", "\n\n  \n")) == []


def test_sample_cut_inside_a_multibyte_character_is_still_detected() -> None:
    data = CHINESE_TEXT.encode("gb18030") * 40
    sample = data[:1001]  # ends inside a two-byte character
    assert detect_encoding(sample, complete=False) == "gb18030"
    assert decode_bytes(data).startswith(CHINESE_TEXT)


def test_utf8_with_a_stray_invalid_byte_stays_utf8(tmp_path: Path) -> None:
    text = "Ünïcödé façade, naïve café, Größe. " * 40
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode() + b" stray \xe9 byte\n")
    assert detect_file_encoding(path) == "utf-8"
    assert joined(parse_all(path)) == text + " stray \ufffd byte"
