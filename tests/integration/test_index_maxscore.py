"""MaxScore over a real Tantivy index (ingest/index/maxscore.py): the best documents of a
disjunction, found without scoring the commonest words' postings, are the ones the plain
disjunction keeps, scored as it scores them, in its order; the common words are in fact left out
of the first search; and each way back to the plain disjunction still answers the same."""

from __future__ import annotations

import numpy as np
import pytest
import tantivy

from knowledgeops.ingest.index import maxscore
from knowledgeops.ingest.index.keywords import K1, _schema, idf

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


def clauses(searcher: tantivy.Searcher, words: list[str]) -> list[maxscore.Clause]:
    """The clauses keywords.py makes: boosted terms, bounded with every document ever added
    (Tantivy's idf counts the deleted ones)."""
    found = []
    for word in words:
        held = searcher.doc_freq("text", word)
        if held:
            term = tantivy.Query.term_query(_schema(), "text", word)
            bound = BOOST * idf(held, DOCS + OKAPIS) * (K1 + 1.0)
            found.append(maxscore.Clause(tantivy.Query.boost_query(term, BOOST), bound, held))
    return found


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


def test_the_best_documents_are_the_plain_disjunctions_scored_as_it_scores_them(
    searcher: tantivy.Searcher,
) -> None:
    rng = np.random.default_rng(9)
    pruned = 0
    for _ in range(60):
        words = [f"w{n}" for n in rng.choice(400, size=int(rng.integers(1, 6)), replace=False)]
        words += [w for w in ("everywhere", "often") if rng.random() < 0.7]
        for want in (1, 7, 40, 150):
            expected = full_top(searcher, words, want)
            got = maxscore.best(searcher, _schema(), clauses(searcher, words), want)
            assert_same(got, expected)
            pruned += "everywhere" in words
    assert pruned > 100


def test_the_commonest_words_are_left_out_of_the_first_search(
    searcher: tantivy.Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    real = maxscore._disjunction

    def spy(found: list[maxscore.Clause]) -> tantivy.Query:
        asked.append(len(found))
        return real(found)

    monkeypatch.setattr(maxscore, "_disjunction", spy)
    words = ["w150", "w200", "w77", "everywhere"]
    got = maxscore.best(searcher, _schema(), clauses(searcher, words), 10)
    assert asked
    assert set(asked) == {3}  # "everywhere", in 97% of the documents, left out
    assert_same(got, full_top(searcher, words, 10))
    asked.clear()
    rare = ["w150", "w200", "w77"]  # none common enough to leave out: the plain disjunction
    assert_same(
        maxscore.best(searcher, _schema(), clauses(searcher, rare), 10),
        full_top(searcher, rare, 10),
    )
    assert asked == [3]


def test_a_floor_the_common_words_could_reach_alone_asks_every_word(
    searcher: tantivy.Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rare word is held by fewer documents than asked for: the rest of the best hold only
    the common word, so no floor can be set and the plain disjunction answers."""
    asked: list[int] = []
    real = maxscore._disjunction
    monkeypatch.setattr(
        maxscore, "_disjunction", lambda found: asked.append(len(found)) or real(found)
    )
    words = ["w390", "everywhere"]
    rare = searcher.doc_freq("text", "w390")
    assert 0 < rare < 100
    got = maxscore.best(searcher, _schema(), clauses(searcher, words), 100)
    assert asked == [1, 2]
    assert_same(got, full_top(searcher, words, 100))


def test_many_documents_at_the_floor_are_all_scored_or_the_plain_disjunction_answers(
    searcher: tantivy.Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 documents share the best score: the rare word's list is asked again, longer, until
    its last falls under the cut, and the lowest seqs of the tie are kept; with fewer allowed
    than that, the plain disjunction answers the same."""
    words = ["okapi", "everywhere"]
    expected = full_top(searcher, words, 5)
    assert [seq for seq, _ in expected] == list(range(DOCS, DOCS + 5))
    assert_same(maxscore.best(searcher, _schema(), clauses(searcher, words), 5), expected)
    monkeypatch.setattr(maxscore, "EXACT_MAX", 50)
    assert_same(maxscore.best(searcher, _schema(), clauses(searcher, words), 5), expected)


def test_without_pruning_the_answer_is_the_same(
    searcher: tantivy.Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    words = ["w3", "w41", "everywhere", "often"]
    pruned = maxscore.best(searcher, _schema(), clauses(searcher, words), 40)
    monkeypatch.setattr(maxscore, "PRUNE", False)
    plain = maxscore.best(searcher, _schema(), clauses(searcher, words), 40)
    assert_same(pruned, full_top(searcher, words, 40))
    assert_same(plain, full_top(searcher, words, 40))
    assert maxscore.best(searcher, _schema(), [], 5) == []
    assert maxscore.best(searcher, _schema(), clauses(searcher, words), 0) == []
