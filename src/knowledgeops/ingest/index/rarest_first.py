"""The best documents of a disjunction of terms, found by its rarest terms and scored by all of
them, around tantivy-py, whose searches score every posting of every term asked (keywords.py;
docs/architecture.md, "Keyword search at a million chunks").

A question's commonest words hold most of its postings and weigh least: in a dataset of a
million chunks of the Debian FAQ, "debian" is in nine chunks of ten with an idf of 0.1, against
10 for a word a few hundred chunks hold. So a search:

1. asks Tantivy the rarest terms alone (`rare`: the caller chooses them by their postings) for
   their best FIRST_ASK × `want` documents, the candidates, each with its rare terms' score;
2. adds to each candidate the other terms' part of its score (`common`), asked of Tantivy for
   those documents alone: each common term is a required-optional step over the candidates,
   which seeks its postings to each of them (a union of the common terms would score every
   posting near each one, a window of 4,096 documents);
3. keeps the best `want` by the sum.

Every document returned is scored by every term, as the plain disjunction scores it (up to float
rounding: the two parts are added in another order). What it can miss is a document the rare
terms rank below the candidates and the common ones lift into the best `want`. Measured on a
million chunks of the bench's corpus against every word's plain disjunction, this keeps more of
its best ten than asking only the words that fit a postings budget did, for a fraction of the
postings (docs/performance.md, "Rarest words first, every word's score")."""

from __future__ import annotations

from collections.abc import Sequence

import tantivy

CANDIDATE_POSTINGS_PER_CHUNK = 1.0  # the rarest words of a question that find the candidates
# hold at most so many postings per chunk of the dataset together (keywords.py)
FIRST_ASK = 2  # × want: the candidates they are asked for
RESCORE = True  # False: the plain disjunction of the rarest words a search may read
# (terms.QUERY_POSTINGS_PER_CHUNK), as before this module (the bench compares both)


def best(
    searcher: tantivy.Searcher,
    schema: tantivy.Schema,
    rare: Sequence[tantivy.Query],
    common: Sequence[tantivy.Query],
    want: int,
) -> list[tuple[int, float]]:
    """(seq, score) of the best `want` documents (documents with a "seq" integer field, indexed
    and fast) found by the disjunction of `rare` among its best FIRST_ASK × `want`, each scored
    by the disjunction of `rare` and `common`; best first, equal scores by seq. With no common
    term, the plain disjunction's best `want`."""
    if not rare or want <= 0:
        return []
    if not common:
        return _sorted(top(searcher, _disjunction(rare), want))
    found = top(searcher, _disjunction(rare), want * FIRST_ASK)
    if not found:
        return []
    added = common_part(searcher, schema, common, [seq for seq, _ in found])
    return _sorted([(seq, score + added.get(seq, 0.0)) for seq, score in found])[:want]


def common_part(
    searcher: tantivy.Searcher,
    schema: tantivy.Schema,
    common: Sequence[tantivy.Query],
    seqs: Sequence[int],
) -> dict[int, float]:
    """The score the disjunction of `common` gives each document of `seqs` that holds one of its
    terms. The documents are a constant-0 disjunction of their seq terms, required; each common
    term is an optional step on top, so Tantivy seeks its postings to those documents alone."""
    query = tantivy.Query.const_score_query(
        tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "seq", seq)) for seq in seqs]
        ),
        0.0,
    )
    for term in common:
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Must, query), (tantivy.Occur.Should, term)]
        )
    return {seq: score for seq, score in top(searcher, query, len(seqs)) if score > 0.0}


def _disjunction(queries: Sequence[tantivy.Query]) -> tantivy.Query:
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, query) for query in queries])


def _sorted(found: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return sorted(found, key=lambda item: (-item[1], item[0]))


def top(searcher: tantivy.Searcher, query: tantivy.Query, want: int) -> list[tuple[int, float]]:
    """(seq, score) of the best `want` documents for `query`."""
    found = searcher.search(query, want, count=False)
    seqs = searcher.fast_field_values("seq", [address for _, address in found.hits])
    return [(int(seq or 0), float(score)) for seq, (score, _) in zip(seqs, found.hits, strict=True)]
