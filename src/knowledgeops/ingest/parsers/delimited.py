"""CSV and TSV files: decoded as a stream like plain text (encoding.py), the dialect sniffed from
the first lines, each row a line of `header: value` pairs (sheets.py).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from pathlib import Path

from knowledgeops.errors import PermanentError
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.encoding import iter_decoded
from knowledgeops.ingest.parsers.sheets import RowCounter, sheet_blocks

SNIFF_CHARS = 32 * 1024  # text the dialect is sniffed from
DELIMITERS = ",;\t|"
MAX_FIELD_CHARS = 1024 * 1024  # one field (csv's own default is 128 KiB)


def _lines(pieces: Iterable[str]) -> Iterator[str]:
    """Decoded pieces as lines that keep their line ends (as csv.reader wants them)."""
    rest = ""
    for piece in pieces:
        rest += piece
        lines = rest.split("\n")
        rest = lines.pop()
        for line in lines:
            yield line + "\n"
    if rest:
        yield rest


def _dialect(sample: str) -> tuple[type[csv.Dialect] | csv.Dialect, str | None]:
    """The sniffed dialect, or (when the sniffer cannot decide, e.g. on a single line) Excel's
    with the delimiter the first line has most of."""
    try:
        return csv.Sniffer().sniff(sample, delimiters=DELIMITERS), None
    except csv.Error:
        first = sample.split("\n", 1)[0]
        best = max(DELIMITERS, key=first.count)
        return csv.excel, best if first.count(best) else ","


class CsvParser:
    """Comma-, semicolon-, tab- or pipe-separated values in any common encoding."""

    content_type = ContentType.CSV

    def parse(self, path: Path) -> Iterator[Block]:
        lines = _lines(iter_decoded(path))
        head: list[str] = []
        size = 0
        for line in lines:
            head.append(line)
            size += len(line)
            if size >= SNIFF_CHARS:
                break
        sample = "".join(head[:-1] if len(head) > 1 and size >= SNIFF_CHARS else head)
        dialect, delimiter = _dialect(sample)

        def all_lines() -> Iterator[str]:
            yield from head
            yield from lines

        csv.field_size_limit(MAX_FIELD_CHARS)
        reader = (
            csv.reader(all_lines(), dialect)
            if delimiter is None
            else csv.reader(all_lines(), dialect, delimiter=delimiter)
        )
        try:
            yield from sheet_blocks(_rows(reader), None, RowCounter())
        except csv.Error as exc:
            raise PermanentError(
                f"The file could not be read as CSV near line {reader.line_num:,}: {exc}. Check "
                "that it is comma-, semicolon- or tab-separated text with balanced quotes.",
                code="corrupt_file",
            ) from exc


def _rows(reader: Iterator[list[str]]) -> Iterator[list[object]]:
    for row in reader:
        yield [value or None for value in row]
