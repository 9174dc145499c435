"""Extract the Debian FAQ collections for `kops eval` from Debian's own packages.

    python eval/extract_debian_faq.py            # writes eval/debian-faq/

Downloads `debian-faq` and its translations with `apt-get download` (no root needed), unpacks
them with `dpkg-deb -x`, and copies each language's HTML pages verbatim (the licence asks for
verbatim copies with its notice: `COPYRIGHT` is copied beside them). Then it reads every page's
sections (DocBook `div.section`, each headed by an `h2`..`h4` with an anchor shared by every
translation) into `sections.json`: per language, per anchor, the page, the heading and the
section's text. A section whose English heading is a question is a judged question: its heading
in a language is the question, its text in a language the answer.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from selectolax.lexbor import LexborHTMLParser

PACKAGES = {
    "en": "debian-faq",
    "de": "debian-faq-de",
    "fr": "debian-faq-fr",
    "ja": "debian-faq-ja",
    "ko": "debian-faq-ko",
    "zh-cn": "debian-faq-zh-cn",
}
FAQ = Path("usr/share/doc/debian/FAQ")
NUMBER = re.compile(r"^\s*(\d+\.)+\s*")


def _pages(root: Path, language: str) -> list[Path]:
    if language == "en":
        return sorted((root / FAQ).glob("*.en.html"))
    return sorted((root / FAQ / language).glob(f"*.{language}.html"))


def _sections(page: Path) -> dict[str, dict[str, str]]:
    tree = LexborHTMLParser(page.read_bytes())
    found: dict[str, dict[str, str]] = {}
    for section in tree.css("div.section"):
        title = section.css_first(
            "div.titlepage h2.title, div.titlepage h3.title, div.titlepage h4.title"
        )
        anchor = title.css_first("a[id]") if title is not None else None
        if title is None or anchor is None:
            continue
        heading = NUMBER.sub("", " ".join(title.text(deep=True).split()))
        body = section.text(deep=True, separator=" ")
        found[anchor.attributes["id"] or ""] = {
            "page": page.name,
            "heading": heading,
            "text": " ".join(body.split()),
        }
    return found


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(["apt-get", "download", *PACKAGES.values()], cwd=work, check=True)
        sections: dict[str, dict[str, dict[str, str]]] = {}
        for language, package in PACKAGES.items():
            (deb,) = work.glob(f"{package}_*.deb")
            root = work / package
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            target = out / language
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            sections[language] = {}
            for page in _pages(root, language):
                shutil.copyfile(page, target / page.name)
                sections[language].update(_sections(page))
            if language == "en":
                notice = root / "usr/share/doc/debian-faq/copyright"
                shutil.copyfile(notice, out / "COPYRIGHT")
        version = re.search(r"_([^_]+)_all\.deb$", next(work.glob("debian-faq_*.deb")).name)
    (out / "sections.json").write_text(
        json.dumps(
            {
                "source": f"Debian packages {', '.join(PACKAGES.values())}, version "
                f"{version.group(1) if version else '?'}",
                "sections": sections,
            },
            ensure_ascii=False,
            indent=1,
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "debian-faq")
