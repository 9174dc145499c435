"""E-books (.epub): the ZIP container's spine read in order, each chapter through the HTML
cleaner (html.py) with its title from the table of contents heading its section path.

The container (META-INF/container.xml) names the package document (OPF); its manifest maps
ids to files and its spine lists the reading order. Chapter titles come from the EPUB 3
navigation document, else from the EPUB 2 NCX; a chapter missing from both keeps the sections
its own headings make. Package and chapters are bounded by package.py and KOPS_MAX_HTML_MB; XML
is read without entities, DTDs or the network. A book whose chapters are encrypted (DRM) is
refused with what to do; font obfuscation, which encrypts fonts only, is not DRM.
"""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lxml import etree  # type: ignore[import-untyped, unused-ignore]

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.html import parse_html_bytes
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.package import open_package, read_part

KIND = "EPUB e-book"
CONTAINER = "META-INF/container.xml"
ENCRYPTION = "META-INF/encryption.xml"
MAX_XML_BYTES = 16 * 1024 * 1024  # the container, the package document, the table of contents
CHAPTER_TYPES = frozenset({"application/xhtml+xml", "text/html"})
NCX_TYPE = "application/x-dtbncx+xml"
DRM_MESSAGE = (
    "The e-book is protected by DRM (its chapters are encrypted), so its text cannot be read. "
    "Upload a DRM-free copy (many publishers and libraries offer one)."
)

_XML = etree.XMLParser(
    resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, recover=True
)


def _broken(what: str) -> PermanentError:
    return PermanentError(
        f"The file is not a valid EPUB e-book: {what}. Export it again as EPUB and upload the "
        "new copy.",
        code="corrupt_file",
    )


def _xml(archive: zipfile.ZipFile, name: str) -> Any:
    try:
        data = read_part(archive, name, KIND, MAX_XML_BYTES)
    except KeyError:
        raise _broken(f"it has no {name[:100]}") from None
    root = etree.fromstring(data, _XML) if data.strip() else None
    if root is None:
        raise _broken(f"{name[:100]} is not XML")
    return root


def _local(element: Any) -> str:
    tag = element.tag
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def _elements(root: Any, name: str) -> Iterator[Any]:
    """Elements named `name` in any namespace (books are loose about theirs)."""
    for element in root.iter():
        if _local(element) == name:
            yield element


def _resolve(base: str, href: str) -> str:
    """The ZIP name of `href` (relative to the file `base`), without its fragment."""
    path = unquote(urlsplit(href).path)
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), path)).lstrip("/")


class _Package:
    """What the package document says: the chapters in reading order and their titles."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        rootfile = next(
            (e.get("full-path") for e in _elements(_xml(archive, CONTAINER), "rootfile")), None
        )
        if not rootfile:
            raise _broken("its container names no package document")
        self.opf = unquote(rootfile).lstrip("/")
        opf = _xml(archive, self.opf)
        self.items: dict[str, tuple[str, str, str]] = {}  # id → (name, media type, properties)
        for item in _elements(opf, "item"):
            item_id, href = item.get("id"), item.get("href")
            if item_id and href:
                media = (item.get("media-type") or "").strip().lower()
                self.items[item_id] = (_resolve(self.opf, href), media, item.get("properties", ""))
        self.spine = [
            self.items[ref.get("idref", "")][0]
            for ref in _elements(opf, "itemref")
            if ref.get("idref", "") in self.items
            and self.items[ref.get("idref", "")][1] in CHAPTER_TYPES
        ]
        if not self.spine:
            raise _broken("its spine lists no chapters")
        spine_tag = next(_elements(opf, "spine"), None)
        self.ncx_id = spine_tag.get("toc") if spine_tag is not None else None

    def titles(self, archive: zipfile.ZipFile) -> dict[str, str]:
        """Chapter file → title, from the navigation document or the NCX (best effort: a broken
        table of contents costs the titles, not the text)."""
        nav = next((name for name, _, props in self.items.values() if "nav" in props.split()), None)
        ncx = self.items.get(self.ncx_id or "", (None, None, None))[0]
        if ncx is None:
            ncx = next((n for n, media, _ in self.items.values() if media == NCX_TYPE), None)
        titles: dict[str, str] = {}
        try:
            if nav is not None:
                titles = _nav_titles(archive, nav)
            if not titles and ncx is not None:
                titles = _ncx_titles(archive, ncx)
        except (PermanentError, UserActionRequired, KeyError, etree.LxmlError):
            return {}
        return titles


def _first_titles(entries: Iterator[tuple[str, str]]) -> dict[str, str]:
    titles: dict[str, str] = {}
    for name, raw in entries:
        title = " ".join(raw.split())
        if title and name not in titles:
            titles[name] = title
    return titles


def _nav_titles(archive: zipfile.ZipFile, nav: str) -> dict[str, str]:
    root = _xml(archive, nav)
    tocs = [
        e
        for e in _elements(root, "nav")
        if any(v == "toc" for k, v in e.attrib.items() if k.endswith("type"))
    ]
    scope = tocs[0] if tocs else root
    return _first_titles(
        (_resolve(nav, a.get("href", "")), "".join(a.itertext()))
        for a in _elements(scope, "a")
        if a.get("href")
    )


def _ncx_titles(archive: zipfile.ZipFile, ncx: str) -> dict[str, str]:
    root = _xml(archive, ncx)

    def entries() -> Iterator[tuple[str, str]]:
        for point in _elements(root, "navPoint"):
            label = next(_elements(point, "text"), None)
            content = next(_elements(point, "content"), None)
            if label is not None and content is not None and content.get("src"):
                yield _resolve(ncx, content.get("src")), "".join(label.itertext())

    return _first_titles(entries())


def _check_drm(archive: zipfile.ZipFile, chapters: list[str]) -> None:
    if ENCRYPTION not in archive.namelist():
        return
    root = _xml(archive, ENCRYPTION)
    encrypted = {
        unquote(ref.get("URI", "")).lstrip("/") for ref in _elements(root, "CipherReference")
    }
    if encrypted.intersection(chapters):
        raise UserActionRequired(DRM_MESSAGE, code="epub_drm")


class EpubParser:
    """EPUB 2 and 3 e-books."""

    content_type = ContentType.EPUB

    def parse(self, path: Path) -> Iterator[Block]:
        most = current_limits().max_html_bytes
        with open_package(path, KIND, ".epub", required=(CONTAINER,)) as archive:
            package = _Package(archive)
            _check_drm(archive, package.spine)
            titles = package.titles(archive)
            seen: set[str] = set()
            for name in package.spine:
                if name in seen:
                    continue
                seen.add(name)
                try:
                    data = read_part(archive, name, KIND, most, "KOPS_MAX_HTML_MB")
                except KeyError:
                    raise _broken(f"the chapter {name[:100]} is missing") from None
                yield from parse_html_bytes(data, titles.get(name))
