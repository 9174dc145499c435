"""Judged collections: documents to upload and questions whose answering section is known.

Built from the folders under `eval/` (each has its extraction script and its licence). The Debian
FAQ (`eval/debian-faq`, from Debian's packages) comes in six languages whose sections share their
anchors: a section whose English heading is a question is asked in every language against the
pages of that language, and in English against the Japanese, Chinese and Korean pages (the
cross-lingual collections). Half the questions (by a hash of their anchor) are the development
split that tuning may look at; the other half is the test split.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from knowledgeops.errors import LabError
from knowledgeops.lab.eval.judge import Answer

DEBIAN_FAQ = "debian-faq"
MONOLINGUAL = ("en", "de", "fr", "zh-cn", "ja", "ko")
CROSS_LINGUAL = (("en", "ja"), ("en", "zh-cn"), ("en", "ko"))


class CollectionError(LabError):
    """A collection's folder is missing or malformed; the message says which and how to fix it."""


@dataclass(frozen=True)
class Question:
    id: str
    query: str
    answer: Answer
    page: str
    split: str  # "dev" or "test"


@dataclass(frozen=True)
class Collection:
    name: str
    language: str  # of the pages; the questions' language is in the name when it differs
    corpus: str  # the key of the document set: collections with the same corpus share a dataset
    documents: tuple[Path, ...]
    questions: tuple[Question, ...]


def split_of(anchor: str) -> str:
    return "dev" if hashlib.sha256(anchor.encode()).digest()[0] % 2 == 0 else "test"


def find_root(start: Path | None = None) -> Path | None:
    """The `eval/` folder of the checkout this runs in (the current folder or one above it)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "eval" / DEBIAN_FAQ / "sections.json").is_file():
            return folder / "eval"
    return None


def debian_faq(root: Path, *, max_pages: int | None = None) -> list[Collection]:
    folder = root / DEBIAN_FAQ
    index = folder / "sections.json"
    if not index.is_file():
        raise CollectionError(
            f"{index} is missing: run `python eval/extract_debian_faq.py` in the checkout"
        )
    sections: dict[str, dict[str, dict[str, str]]] = json.loads(index.read_text("utf-8"))[
        "sections"
    ]
    asked = sorted(a for a, s in sections["en"].items() if s["heading"].rstrip().endswith("?"))

    def pages(language: str) -> tuple[Path, ...]:
        files = sorted((folder / language).glob("*.html"))
        if not files:
            raise CollectionError(f"{folder / language} holds no pages: run the extraction")
        return tuple(files[:max_pages] if max_pages else files)

    def questions(
        asked_in: str, answered_in: str, documents: tuple[Path, ...]
    ) -> tuple[Question, ...]:
        names = {path.name for path in documents}
        found = []
        for anchor in asked:
            question, answer = sections[asked_in].get(anchor), sections[answered_in].get(anchor)
            if question is None or answer is None or answer["page"] not in names:
                continue
            found.append(
                Question(
                    id=anchor,
                    query=question["heading"],
                    answer=Answer.of(answer["text"]),
                    page=answer["page"],
                    split=split_of(anchor),
                )
            )
        return tuple(found)

    collections = []
    for language in MONOLINGUAL:
        documents = pages(language)
        collections.append(
            Collection(
                f"{DEBIAN_FAQ}-{language}",
                language,
                f"{DEBIAN_FAQ}-{language}",
                documents,
                questions(language, language, documents),
            )
        )
    for asked_in, answered_in in CROSS_LINGUAL:
        documents = pages(answered_in)
        collections.append(
            Collection(
                f"{DEBIAN_FAQ}-{asked_in}>{answered_in}",
                answered_in,
                f"{DEBIAN_FAQ}-{answered_in}",
                documents,
                questions(asked_in, answered_in, documents),
            )
        )
    return collections


def load(
    root: Path,
    *,
    only: list[str] | None = None,
    max_pages: int | None = None,
    max_questions: int | None = None,
) -> list[Collection]:
    """The collections under `root`, those named in `only` (exact names or prefixes)."""
    collections = debian_faq(root, max_pages=max_pages)
    if only:
        chosen = [c for c in collections if any(c.name == o or c.name.startswith(o) for o in only)]
        if not chosen:
            raise CollectionError(
                f"no collection is named {', '.join(only)}; there are "
                + ", ".join(c.name for c in collections)
            )
        collections = chosen
    if max_questions:
        collections = [
            Collection(c.name, c.language, c.corpus, c.documents, c.questions[:max_questions])
            for c in collections
        ]
    return collections
