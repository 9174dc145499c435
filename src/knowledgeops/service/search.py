"""Search a dataset by meaning (vector), by words (keyword), or both fused by score (hybrid)."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import select

from knowledgeops.cpu import OtherWork, other_work
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents
from knowledgeops.errors import JobError, ServiceUnavailable
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.embedders.models import Models
from knowledgeops.ingest.index.base import ChunkIndex, Hit
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.terms import coverage, query_words
from knowledgeops.service.datasets import Datasets, owned_datasets
from knowledgeops.service.views import SearchHit

CANDIDATES_PER_TOP_K = 4  # each list contributes this many candidates per wanted result
MIN_CANDIDATES = 40
SEARCH_THREADS = 8  # keyword lookups of hybrid searches running beside their vector search


class SearchMode(StrEnum):
    HYBRID = "hybrid"
    VECTOR = "vector"
    KEYWORD = "keyword"


def _spread(hits: Sequence[Hit]) -> dict[str, float]:
    """Vector scores min-max scaled over the candidates (the best 1, the last 0): cosines of one
    query sit close together, and only their order and spacing say anything."""
    if not hits:
        return {}
    best = max(hit.score for hit in hits)
    worst = min(hit.score for hit in hits)
    span = (best - worst) or 1.0
    return {hit.chunk_id: (hit.score - worst) / span for hit in hits}


def merge_scaled(lists: Sequence[Sequence[Hit]]) -> list[Hit]:
    """Rankings of different models merged into one: each hit scored by its score min-max
    scaled within its own list, best first; equal scores keep the better rank, then the
    earlier list."""
    scored: list[tuple[float, int, int, Hit]] = []
    for position, hits in enumerate(lists):
        spread = _spread(hits)
        for rank, hit in enumerate(hits):
            scored.append((spread[hit.chunk_id], rank, position, hit))
    scored.sort(key=lambda item: (-item[0], item[1], item[2]))
    return [_rescored(hit, score) for score, _, _, hit in scored]


def _over_best(hits: Sequence[Hit]) -> dict[str, float]:
    """Keyword scores over the best (BM25 and ts_rank_cd have no fixed scale)."""
    if not hits:
        return {}
    best = max(hit.score for hit in hits) or 1.0
    return {hit.chunk_id: hit.score / best for hit in hits}


def score_fusion(
    query: str,
    vector: Sequence[Hit],
    keyword: Sequence[Hit],
    vector_weight: float,
    limit: int | None = None,
) -> list[Hit]:
    """Fuse the two rankings by their scores: w·v + (1 − w)·k·c², where v is the vector score
    scaled over the candidates, k the keyword score over the best, and c the share of the
    query's words the chunk holds (terms.coverage); a chunk missing from a list gets nothing
    from it. The coverage keeps a keyword ranking that matched one word of the question (an
    English question against Japanese pages matches "Debian" and little else) from outvoting
    the vectors; the weight is the model's (ModelSpec.vector_weight), chosen on the dev split
    of `kops eval`'s collections (docs/search-quality.md). Reciprocal-rank fusion, which it
    replaces, gives every list equal votes per rank whatever the scores: it lost to the better
    single mode on every collection. Equal scores keep the order the lists gave (the better
    rank first, vector before keyword), so the same lists always fuse into the same order."""
    if limit is not None and limit <= 0:
        return []
    spread, over_best = _spread(vector), _over_best(keyword)
    words = query_words(query)
    first_seen: dict[str, Hit] = {}
    best: dict[str, tuple[int, int]] = {}
    for position, ranking in enumerate((vector, keyword)):
        for rank, hit in enumerate(ranking, start=1):
            first_seen.setdefault(hit.chunk_id, hit)
            best[hit.chunk_id] = min(best.get(hit.chunk_id, (rank, position)), (rank, position))
    texts = {hit.chunk_id: hit.text for hit in keyword}
    scores = {
        chunk_id: vector_weight * spread[chunk_id] for chunk_id in spread if chunk_id not in texts
    }
    # a keyword hit's score lies between its vector part and that plus its whole keyword part
    # (the coverage is at most 1): its words are looked for only while it can still reach the
    # best `limit`, from the highest bound down: a hit left out scores below `limit` hits already
    # scored, so the fusion returns the same hits, in the same order, as scoring every one
    bound = {
        chunk_id: (1.0 - vector_weight) * over_best[chunk_id]
        + vector_weight * spread.get(chunk_id, 0.0)
        for chunk_id in texts
    }
    kept: list[float] = sorted(scores.values(), reverse=True)[:limit] if limit else []
    heapq.heapify(kept)
    for chunk_id in sorted(texts, key=lambda chunk_id: -bound[chunk_id]):
        if limit is not None and len(kept) >= limit and bound[chunk_id] < kept[0]:
            break
        share = coverage(words, texts[chunk_id])
        score = (1.0 - vector_weight) * over_best[chunk_id] * share * share
        if chunk_id in spread:
            score += vector_weight * spread[chunk_id]
        scores[chunk_id] = score
        if limit is not None:
            heapq.heappush(kept, score)
            if len(kept) > limit:
                heapq.heappop(kept)
    fused = sorted(scores, key=lambda chunk_id: (-scores[chunk_id], best[chunk_id]))[:limit]
    return [_rescored(first_seen[chunk_id], scores[chunk_id]) for chunk_id in fused]


def _rescored(hit: Hit, score: float) -> Hit:
    return dataclasses.replace(hit, score=score)


def words_first(
    index: ChunkIndex, others: OtherWork, dataset_id: str, where: SearchFilter | None
) -> bool:
    """A hybrid search looks its words up before its vector list, not beside it, where the
    vector search scans on every core (ChunkIndex.scans_every_core) and other processes keep
    cores busy (`OtherWork`): there the lookup would take its turn on the scan's cores and the
    scan waits for its slowest thread (twice as slow, measured with the test suite beside it).
    On free cores the two side by side finish sooner (docs/performance.md)."""
    return index.scans_every_core(dataset_id, where) and others.busy()


@dataclass(eq=False)
class Search:
    db: Database
    datasets: Datasets
    index: ChunkIndex
    models: Models  # a query is embedded by its dataset's model (Models.for_queries)
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(SEARCH_THREADS, thread_name_prefix="kops-search")
    )
    others: OtherWork = field(default_factory=other_work)  # other processes' use of the cores

    def search(
        self,
        tenant: str,
        dataset_id: str,
        query: str,
        *,
        top_k: int,
        mode: SearchMode,
        where: SearchFilter | None = None,
    ) -> list[SearchHit]:
        """Chunks of one of the tenant's datasets: the index is asked for that dataset only (and
        the documents `where` admits, inside its query), and the hits' documents are read back
        within the tenant too."""
        # 404 for an unknown dataset or another tenant's
        model = self.datasets.model_of(tenant, dataset_id)
        if mode is SearchMode.KEYWORD:
            hits = self.index.search_keyword(dataset_id, query, top_k, where)
            return self._with_names(tenant, dataset_id, hits)
        # the models that embedded the documents: the dataset's, but while a re-embed is on its
        # way (ingest/reembed.py), when it may be the previous one or both
        held = self._models_held(dataset_id) or [model]
        if mode is SearchMode.VECTOR:
            vectors = [(name, self._vector(query, name)) for name in held]
            hits = self._nearest(dataset_id, vectors, top_k, where)
        else:
            wanted = max(top_k * CANDIDATES_PER_TOP_K, MIN_CANDIDATES)
            # the words are looked up while the query is embedded: the two take about as long,
            # and each waits mostly in C (the model, SQLite). The neighbours are found beside
            # them too, unless this search's scan takes every core (a large dataset's lists in
            # the embedded index) while other processes keep cores busy: then after the words,
            # or the scan's threads would take turns with the lookup (words_first)
            words = self._pool.submit(self.index.search_keyword, dataset_id, query, wanted, where)
            vectors = [(name, self._vector(query, name)) for name in held]
            if words_first(self.index, self.others, dataset_id, where):
                words.result()
            nearest = self._nearest(dataset_id, vectors, wanted, where, fused=True)
            weight = self.models.fusion_weight(held[0] if len(held) == 1 else model)
            hits = score_fusion(query, nearest, words.result(), weight, limit=top_k)
        return self._with_names(tenant, dataset_id, hits)

    def _nearest(
        self,
        dataset_id: str,
        vectors: list[tuple[str, Vectors]],
        k: int,
        where: SearchFilter | None,
        *,
        fused: bool = False,
    ) -> list[Hit]:
        """The k nearest chunks to the query embedded by each model that embedded them
        (`vectors`: model, the query's vector). While the documents are on two models, each
        vector is searched among that model's documents only, and the lists merged by their
        scores scaled per model (cosines of two models are not comparable)."""
        if len(vectors) == 1:
            return self.index.search_vector(dataset_id, vectors[0][1], k, where, fused=fused)
        lists = []
        for name, vector in vectors:
            only = dataclasses.replace(where or SearchFilter(), models=(name,))
            lists.append(self.index.search_vector(dataset_id, vector, k, only, fused=fused))
        return merge_scaled(lists)[:k]

    def _models_held(self, dataset_id: str) -> list[str]:
        """The models that embedded the dataset's searchable documents."""
        with self.db.read() as conn:
            found = conn.scalars(
                select(documents.c.embedding_model)
                .where(
                    documents.c.dataset_id == dataset_id,
                    documents.c.embedding_model.is_not(None),
                )
                .distinct()
            ).all()
        return sorted(str(name) for name in found)

    def _vector(self, query: str, model: str) -> Vectors:
        try:
            vector: Vectors = self.models.for_queries(model).embed([query])[0]
        except JobError as exc:  # the embedding provider failed: not the caller's fault
            retry = int(exc.retry_after_s) if exc.retry_after_s else 5
            raise ServiceUnavailable(
                f"the query could not be embedded: {exc.message}; keyword search still works",
                code=f"search_{exc.code}",
                retry_after_s=max(1, retry),
            ) from exc
        return vector

    def _with_names(self, tenant: str, dataset_id: str, hits: Sequence[Hit]) -> list[SearchHit]:
        ids = {hit.document_id for hit in hits}
        names: dict[str, str] = {}
        if ids:
            with self.db.read() as conn:
                rows = conn.execute(
                    select(documents.c.id, documents.c.file_name).where(
                        documents.c.id.in_(ids),
                        documents.c.dataset_id == dataset_id,
                        documents.c.dataset_id.in_(owned_datasets(tenant)),
                    )
                )
                names = {row.id: row.file_name for row in rows}
        return [
            SearchHit(
                chunk_id=h.chunk_id,
                document_id=h.document_id,
                file_name=names.get(h.document_id, ""),
                ordinal=h.ordinal,
                text=h.text,
                score=float(h.score),
                page_start=h.page_start,
                page_end=h.page_end,
                section=h.section,
            )
            for h in hits
            if h.document_id in names  # a document deleted a moment ago is gone; so is any other
        ]
