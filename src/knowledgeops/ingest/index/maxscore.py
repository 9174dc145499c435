"""The best documents of a disjunction of terms without scoring every posting of its commonest
words, exactly as the plain disjunction ranks them (MaxScore: Turtle and Flood, "Query
evaluation: strategies and optimizations", 1995), around tantivy-py, whose searches score every
posting of every term asked (keywords.py; docs/architecture.md, "Keyword search at a million
chunks").

A term adds at most its bound to a document's score: BM25 is idf × (k1 + 1) × tf / (tf + norm),
and tf / (tf + norm) < 1. A word that most chunks of a dataset hold ("debian" in a Debian FAQ)
has an idf near 0, so a bound near 0, and it is the costliest word of the question: two thirds
of the postings of "other ways of booting a Debian system". So a search:

1. leaves out the commonest terms whose bounds add up to at most ROOM × the rarest term's
   bound, and asks Tantivy the others (the rare terms) for their best FIRST_ASK × `want`;
2. scores the best `want` of those exactly: the common terms' part is asked of Tantivy for
   those documents alone (each common term intersected with their seqs, which seeks its
   postings to each: a union would score every posting near each one). The `want`-th best
   exact score is the floor: at least `want` documents reach it;
3. a document whose rare terms score under the floor less the common terms' bounds cannot
   reach it: every other one is among the rare terms' best (asked for again, WIDEN times as
   many, while the last of the list still reaches the cut) and is scored exactly; the best
   `want` of those are the answer.

When no term is common enough, or the common terms could lift a document of none of the rare
terms to the floor, or too many documents reach the cut, the plain disjunction answers. A score
is the sum of the rare terms' part and the common terms' part, each as Tantivy scores it (in
single precision), so it may differ from the plain disjunction's in the last bit; the cut is
lowered by SLACK for that. On the bench's corpus of near-duplicate passages a third of the
lists differ from the plain search's, always among chunks of the same score (docs/performance.md,
"MaxScore")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tantivy

ROOM = 0.05  # the common terms' bounds add up to at most this share of the rarest term's
FIRST_ASK = 2  # × want: the rare terms' best asked for first …
WIDEN = 4  # … then so many times as many, while the last still reaches the cut …
EXACT_MAX = 4000  # … up to so many; more: the plain disjunction
SLACK = 1e-4  # relative, on the bounds and the floor: Tantivy scores in single precision
PRUNE = True  # False: every search is the plain disjunction (the bench and tests compare both)


@dataclass(frozen=True)
class Clause:
    """A term of the disjunction: its query (a term, boosted), the most it adds to a
    document's score, and how many documents hold it."""

    query: tantivy.Query
    bound: float
    postings: int


def best(
    searcher: tantivy.Searcher, schema: tantivy.Schema, clauses: Sequence[Clause], want: int
) -> list[tuple[int, float]]:
    """(seq, score) of the best `want` documents of the disjunction of `clauses` (documents with
    a "seq" integer field, indexed and fast), best first, scored as the plain disjunction scores
    them (up to the last bit); among equal scores, the lower seq first. Where documents tie at
    the last place, MaxScore keeps those of the lowest seqs, and Tantivy's plain search those
    it met first."""
    if not clauses or want <= 0:
        return []
    order = sorted(range(len(clauses)), key=lambda i: -clauses[i].bound)
    asked = len(order)  # the rare terms: all but the commonest, whose bounds add up to little
    room = ROOM * clauses[order[0]].bound
    while asked > 1 and sum(clauses[i].bound for i in order[asked - 1 :]) <= room:
        asked -= 1
    if not PRUNE or asked == len(order):
        return _plain(searcher, clauses, want)
    rare = [clauses[i] for i in sorted(order[:asked])]  # in the question's order
    common = [clauses[i] for i in sorted(order[asked:])]
    reach = sum(clause.bound for clause in common) * (1.0 + SLACK)
    limit = want * FIRST_ASK
    hits = _top(searcher, _disjunction(rare), limit)
    exact: dict[int, float] = {}
    _score_exactly(searcher, schema, common, hits[:want], exact)
    cut = _floor(exact, want) - reach
    if cut <= 0.0:  # a document of common terms alone might reach the floor
        return _plain(searcher, clauses, want)
    while len(hits) == limit and hits[-1][1] >= cut:  # more documents may reach the cut
        if limit >= EXACT_MAX:
            return _plain(searcher, clauses, want)
        limit = min(limit * WIDEN, EXACT_MAX)
        hits = _top(searcher, _disjunction(rare), limit)
    _score_exactly(searcher, schema, common, [hit for hit in hits if hit[1] >= cut], exact)
    return _sorted(list(exact.items()))[:want]


def _plain(
    searcher: tantivy.Searcher, clauses: Sequence[Clause], want: int
) -> list[tuple[int, float]]:
    """The plain disjunction's best `want`: every posting of every clause scored."""
    return _sorted(_top(searcher, _disjunction(clauses), want))


def _floor(exact: dict[int, float], want: int) -> float:
    """A score at least `want` documents reach: the `want`-th best scored exactly (0 when fewer
    were), a little lowered for single precision."""
    if len(exact) < want:
        return 0.0
    return sorted(exact.values(), reverse=True)[want - 1] * (1.0 - SLACK)


def _score_exactly(
    searcher: tantivy.Searcher,
    schema: tantivy.Schema,
    common: Sequence[Clause],
    hits: list[tuple[int, float]],
    exact: dict[int, float],
) -> None:
    """Add to `exact` the full score of each document of `hits` (seq, its rare terms' score)
    not in it yet: its rare terms' score and its common terms', asked of Tantivy for those
    documents alone."""
    missing = [(seq, score) for seq, score in hits if seq not in exact]
    if not missing:
        return
    only = tantivy.Query.const_score_query(
        tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Should, tantivy.Query.term_query(schema, "seq", seq))
                for seq, _ in missing
            ]
        ),
        0.0,
    )
    query = tantivy.Query.boolean_query(
        [
            (
                tantivy.Occur.Should,
                tantivy.Query.boolean_query(
                    [(tantivy.Occur.Must, only), (tantivy.Occur.Must, clause.query)]
                ),
            )
            for clause in common
        ]
    )
    added = dict(_top(searcher, query, len(missing)))
    for seq, score in missing:
        exact[seq] = score + added.get(seq, 0.0)


def _disjunction(clauses: Sequence[Clause]) -> tantivy.Query:
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, clause.query) for clause in clauses])


def _sorted(found: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return sorted(found, key=lambda item: (-item[1], item[0]))


def _top(searcher: tantivy.Searcher, query: tantivy.Query, want: int) -> list[tuple[int, float]]:
    """(seq, score) of the best `want` documents for `query`."""
    found = searcher.search(query, want, count=False)
    seqs = searcher.fast_field_values("seq", [address for _, address in found.hits])
    return [(int(seq or 0), float(score)) for seq, (score, _) in zip(seqs, found.hits, strict=True)]
