"""ZIP containers (DOCX, PPTX, XLSX, EPUB), checked before anything is inflated.

Every format built on a ZIP package goes through `open_package`: the central directory is read
(nothing is inflated yet), then refused when the parts inflate to more than KOPS_MAX_UNZIPPED_MB
in all, when one part inflates more than KOPS_MAX_ZIP_RATIO times (a ZIP bomb), when it holds an
absurd number of parts, or when a part the format needs is missing. `read_part` reads one part
with a ceiling on what it may inflate to, whatever its header claims.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.limits import MB
from knowledgeops.ingest.parsers.limits import current as current_limits

OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
RATIO_CHECK_MIN_BYTES = 1024 * 1024
"""A part that inflates more than `max_zip_ratio` times (real documents stay far below 50) is
refused once it inflates to at least this much (tiny parts may compress extremely well)."""
MAX_PARTS = 100_000
"""Parts of one package: an office file or e-book has hundreds, a few thousand at most."""


def encrypted_message(kind: str, extension: str) -> str:
    return (
        f"The {kind} is password-protected (or is an old binary Office file). Remove the "
        f"password, or open it and save it as {extension}, then upload it again."
    )


def open_package(
    path: Path, kind: str, extension: str, required: tuple[str, ...] = ()
) -> zipfile.ZipFile:
    """The ZIP package at `path`, after the cheap checks (see the module docstring); `kind` names
    the format for a person ("PowerPoint presentation"), `required` the parts it cannot do
    without. The caller closes it."""
    with path.open("rb") as fh:
        magic = fh.read(len(OLE2_MAGIC))
    if magic == OLE2_MAGIC:
        raise UserActionRequired(
            encrypted_message(kind, extension), code=f"{extension.lstrip('.')}_encrypted"
        )
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise PermanentError(
            f"The file is not a valid {kind} (it is not a readable ZIP package); it may be "
            f"damaged. Save it again as {extension} and upload the new copy.",
            code="corrupt_file",
        ) from exc
    try:
        check_members(archive, kind, path.stat().st_size)
        names = set(archive.namelist())
        for part in required:
            if part not in names:
                raise PermanentError(
                    f"The file is not a valid {kind}: it has no {part}. Save it again as "
                    f"{extension} and upload the new copy.",
                    code="corrupt_file",
                )
    except BaseException:
        archive.close()
        raise
    return archive


def check_members(archive: zipfile.ZipFile, kind: str, file_size: int) -> None:
    """Refuse a package whose parts, by their headers, inflate beyond the limits, or lie outside
    the file (a damaged central directory, which zipfile would meet as a failed seek)."""
    members = archive.infolist()
    for member in members:
        if (
            not 0
            <= member.header_offset
            <= member.header_offset + member.compress_size
            <= file_size
        ):
            raise PermanentError(
                f"The file is not a valid {kind}: its ZIP directory points outside the file "
                "(it is damaged or incomplete). Save it again and upload the new copy.",
                code="corrupt_file",
            )
    limits = current_limits()
    if len(members) > MAX_PARTS:
        raise PermanentError(
            f"The {kind} holds {len(members):,} parts, more than {MAX_PARTS:,}: it looks "
            "built to exhaust parsers and was not opened.",
            code="zip_bomb",
        )
    inflated = sum(m.file_size for m in members)
    if inflated > limits.max_unzipped_bytes:
        raise UserActionRequired(
            f"The {kind} expands to {inflated / MB:,.0f} MB when unpacked; this server "
            f"accepts at most {limits.max_unzipped_mb:g} MB (KOPS_MAX_UNZIPPED_MB). Split it "
            "into smaller documents, or remove large embedded images and objects.",
            code="too_large",
        )
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size >= RATIO_CHECK_MIN_BYTES and ratio > limits.max_zip_ratio:
            raise PermanentError(
                f"The {kind} holds a part ({member.filename[:100]}) that expands {ratio:,.0f} "
                f"times, more than {limits.max_zip_ratio:g} (KOPS_MAX_ZIP_RATIO): it looks "
                "like a ZIP bomb and was not opened.",
                code="zip_bomb",
            )


def read_part(
    archive: zipfile.ZipFile,
    name: str,
    kind: str,
    most: int | None = None,
    setting: str = "KOPS_MAX_UNZIPPED_MB",
) -> bytes:
    """One part, inflated, refused past `most` bytes (default: the package limit; `setting`
    names the limit) even when its header understates its size."""
    limits = current_limits()
    ceiling = limits.max_unzipped_bytes if most is None else min(most, limits.max_unzipped_bytes)
    with archive.open(name) as fh:
        data = fh.read(ceiling + 1)
    if len(data) > ceiling:
        raise UserActionRequired(
            f"A part of the {kind} ({name[:100]}) expands to more than {ceiling / MB:,.0f} MB; "
            f"this server does not read parts that large ({setting}). Split the "
            "document into smaller ones.",
            code="too_large",
        )
    return data
