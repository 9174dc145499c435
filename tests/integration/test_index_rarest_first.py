"""Rarest first over a real Tantivy index (ingest/index/rarest_first.py): every document a search
returns carries the plain disjunction's score of every term; the common terms are asked for
the candidates alone; where every match of the rare terms is a candidate, the answer is the
plain disjunction's ranking of those matches, ties and deleted documents included."""

from __future__ import annotations

import numpy as np
import pytest
import tantivy

from knowledgeops.ingest.index import rarest_first
from knowledgeops.ingest.index.keywords import _schema

DOCS = 3000
OKAPIS = 200  # documents that are all "okapi everywhere": one score shared by 200
DELETED = 3  # seq % 10 == DELETED is deleted (Tantivy's idf still counts them until a merge)
BOOST = 1.3


@pytest.fixture(scope="module")
def searcher() -> tantivy.Searcher:
    schema = _schema()
    index = tantivy.Index(schema)
    writer = index.writer(heap_size=15_000_000, num_threads=1)
    rng = np.random.default_rng(5)
    weights = 1.0 / np.arange(1, 401)
    weights /= weights.sum()
    for seq in range(DOCS):
        words = [f"w{n}" for n in rng.choice(400, size=int(rng.integers(4, 80)), p=weights)]
        if rng.random() < 0.97:
            words += ["everywhere"] * int(rng.integers(1, 4))
        if rng.random() < 0.6:
            words.append("often")
        rng.shuffle(words)
        writer.add_document(tantivy.Document(text=" ".join(words), seq=seq, dataset=0))
    for seq in range(DOCS, DOCS + OKAPIS):
        writer.add_document(tantivy.Document(text="okapi everywhere", seq=seq, dataset=0))
    writer.commit()
    for seq in range(DELETED, DOCS, 10):
        writer.delete_documents_by_term("seq", seq)
    writer.commit()
    index.reload()
    return index.searcher()


def terms(words: list[str]) -> list[tantivy.Query]:
    """The boosted terms keywords.py makes."""
    return [
        tantivy.Query.boost_query(tantivy.Query.term_query(_schema(), "text", word), BOOST)
        for word in words
    ]


def reference(searcher: tantivy.Searcher, words: list[str]) -> list[tuple[int, float]]:
    """Every match of the plain disjunction, scored by Tantivy, by score then seq."""
    query = tantivy.Query.boolean_query(
        [
            (
                tantivy.Occur.Should,
                tantivy.Query.boost_query(tantivy.Query.term_query(_schema(), "text", w), BOOST),
            )
            for w in words
        ]
    )
    hits = searcher.search(query, DOCS + OKAPIS, count=False).hits
    seqs = searcher.fast_field_values("seq", [address for _, address in hits])
    found = [(int(seq or 0), score) for seq, (score, _) in zip(seqs, hits, strict=True)]
    return sorted(found, key=lambda item: (-item[1], item[0]))


def assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    """The same scores position by position (the last bit aside), and the same documents
    wherever a score is not shared (within that bit) with a neighbour in the full list."""
    assert len(got) == len(want)
    for (seq, score), (expected_seq, expected) in zip(got, want, strict=True):
        assert score == pytest.approx(expected, rel=1e-6)
        if seq != expected_seq:
            assert score == pytest.approx(dict(want).get(seq, expected), rel=1e-6)


def full_top(searcher: tantivy.Searcher, words: list[str], want: int) -> list[tuple[int, float]]:
    """The plain disjunction's best `want`, ties broken by seq over every match."""
    return reference(searcher, words)[:want]


def test_every_document_returned_carries_every_terms_score(searcher: tantivy.Searcher) -> None:
    """Random questions, their rarest one to three words asked first: each document returned is
    scored as the plain disjunction of every word scores it, best first; where the rare words
    match no more documents than the candidates, the answer is the plain disjunction's ranking
    of the documents they match."""
    rng = np.random.default_rng(9)
    whole = 0
    for _ in range(60):
        words = [f"w{n}" for n in rng.choice(400, size=int(rng.integers(1, 6)), replace=False)]
        words += [w for w in ("everywhere", "often") if rng.random() < 0.7]
        by_postings = sorted(words, key=lambda word: searcher.doc_freq("text", word))
        split = int(rng.integers(1, len(words) + 1))
        rare, common = by_postings[:split], by_postings[split:]
        every = dict(reference(searcher, words))
        matched = len(reference(searcher, rare))
        for want in (1, 7, 40, 150):
            got = rarest_first.best(searcher, _schema(), terms(rare), terms(common), want)
            assert len(got) == min(want, matched)
            assert [score for _, score in got] == sorted((s for _, s in got), reverse=True)
            for seq, score in got:
                assert score == pytest.approx(every[seq], rel=1e-5)
            if matched <= want * rarest_first.FIRST_ASK:
                expected = [
                    item
                    for item in reference(searcher, words)
                    if item[0] in dict(reference(searcher, rare))
                ][:want]
                assert_same(got, expected)
                whole += bool(common)
    assert whole > 20


def test_the_common_terms_are_asked_for_the_candidates_alone(
    searcher: tantivy.Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "everywhere", in 97% of the documents, is not in the disjunction Tantivy ranks: it is
    asked only for the FIRST_ASK × want candidates the rare words found."""
    asked: list[int] = []
    parts: list[tuple[int, int]] = []
    real_disjunction, real_part = rarest_first._disjunction, rarest_first.common_part

    def disjunction(queries: list[tantivy.Query]) -> tantivy.Query:
        asked.append(len(queries))
        return real_disjunction(queries)

    def part(searcher, schema, common, seqs) -> dict[int, float]:  # type: ignore[no-untyped-def]
        parts.append((len(common), len(seqs)))
        return real_part(searcher, schema, common, seqs)

    monkeypatch.setattr(rarest_first, "_disjunction", disjunction)
    monkeypatch.setattr(rarest_first, "common_part", part)
    rare, common = ["w150", "w200", "w77"], ["everywhere"]
    got = rarest_first.best(searcher, _schema(), terms(rare), terms(common), 10)
    assert asked == [3]
    assert parts == [(1, 10 * rarest_first.FIRST_ASK)]
    every = dict(reference(searcher, rare + common))
    assert all(score == pytest.approx(every[seq], rel=1e-5) for seq, score in got)
    # the common part is what the plain disjunction adds: without it, the scores fall short
    alone = dict(reference(searcher, rare))
    assert any(every[seq] > alone[seq] * (1 + 1e-4) for seq, _ in got)


def test_tied_documents_keep_one_score_and_the_lowest_seqs_first(
    searcher: tantivy.Searcher,
) -> None:
    """200 documents "okapi everywhere" share one score: the five returned are of that score,
    ordered by seq."""
    got = rarest_first.best(searcher, _schema(), terms(["okapi"]), terms(["everywhere"]), 5)
    expected = reference(searcher, ["okapi", "everywhere"])[0][1]
    assert [score for _, score in got] == pytest.approx([expected] * 5, rel=1e-6)
    assert [seq for seq, _ in got] == sorted(seq for seq, _ in got)
    assert all(DOCS <= seq < DOCS + OKAPIS for seq, _ in got)


def test_no_common_term_is_the_plain_disjunction_and_nothing_asked_is_nothing(
    searcher: tantivy.Searcher,
) -> None:
    words = ["w3", "w41", "everywhere", "often"]
    assert_same(
        rarest_first.best(searcher, _schema(), terms(words), [], 40), full_top(searcher, words, 40)
    )
    assert rarest_first.best(searcher, _schema(), [], terms(words), 5) == []
    assert rarest_first.best(searcher, _schema(), terms(words), [], 0) == []
    assert rarest_first.best(searcher, _schema(), terms(["absent"]), terms(words), 5) == []
