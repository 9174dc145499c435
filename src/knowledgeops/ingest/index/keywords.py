"""The keyword index at scale: Tantivy beside the database, never trusted on its own
(docs/architecture.md: Keyword search at a million chunks). The embedded index keeps one beside
its SQLite file (`SqliteChanges` below); each scale-out API process keeps one beside PostgreSQL
(pg_changes.py). Only where the changes are read and how far the index got is kept differ: a
`ChangeLog`.

SQLite's FTS5 ranks every chunk that holds a word of the question, in every dataset, before a
search can keep its own dataset's best: at a million chunks that is a second a search. Tantivy
(a Rust Lucene) reads only the question's terms of the question's dataset: each term is held as
`<dataset key>.<shard>:<word>`, so a search is a plain disjunction of its dataset's terms
(asking for `+dataset +(word word …)` made an intersection that Tantivy scores match by match:
8.9 ms against 2.8 at 300,000 chunks), and the BM25 statistics of a word are its dataset's, as
they would be in an index of its own: no tenant's words move another's ranking. Below
`KEYWORD_MIN_CHUNKS` chunks in the whole table the engine's own full-text search is fast enough
and this index is not made.

tantivy-py collects every search through a `MultiCollector`, which scores every posting of the
terms asked (Tantivy's block-max WAND runs only for its plain top-docs collector): a search's
cost is the postings of its words. So the question's rarest words find the candidates and
every word scores them (rarest_first.py: the commonest words, which weigh least and hold most
postings, are read only for the candidates), and the chunks are split by seq into `SHARDS`
shards, each with terms of its own, searched at once on as many threads (tantivy-py releases
the GIL while it searches). A word's terms in every shard are weighted (a boost) so that each
scores with the idf of the whole dataset: the shards rank the chunks as one index would
(docs/architecture.md, "Keyword search at a million chunks").

The database stays the truth, as for the graphs (graphs.py): the index follows a log of changes
(chunks activated, chunks dropped, a dataset reset) written in the transactions that make them,
applied by one background thread in log order and committed; how far a commit got is saved
after the commit, so a crash between the two only replays rows (an add deletes the seq's
document first, and adds only a chunk the database still holds: replaying is harmless). A build
saves nothing until its commit, so an index half built when its process died is built again.
A search:

- takes Tantivy's best candidates of the dataset (more when a filter admits a small share);
- adds the chunks logged as added since the last commit, scored by the same BM25 formula in
  Python with the index's statistics (a completed job is found at once);
- keeps those that are active now and pass the filter, joined in SQL in one read transaction
  (a stale generation or a deleted document the index still holds cannot answer).

When the index is not built yet, is far behind, or the candidates run short under a filter, the
engine's own full-text search (FTS5, or PostgreSQL's GIN index) answers exactly as before. The
terms are `terms.index_text`'s (CJK cut into words and bigrams), lower-cased, Latin diacritics
removed and split on what is not a letter or a digit: what FTS5's `unicode61 remove_diacritics
2` makes of the same text.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import shutil
import threading
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import tantivy
from sqlalchemy import Connection

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import rarest_first
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.terms import TERMS_VERSION, index_text, rarest_terms

log = logging.getLogger(__name__)

KEYWORD_MIN_CHUNKS = 20_000  # active chunks in the whole table from which searches use Tantivy
PENDING_MAX = 2000  # logged changes a search scores itself; more: FTS5
APPLY_BATCH = 5000  # log rows applied per commit
READ_BATCH = 5000  # chunks read per fetch while building
ACTIVE_CHUNKS = (  # what a build indexes, in either database
    "SELECT c.seq, c.dataset_id, c.text FROM chunks c JOIN documents d "
    "ON d.id = c.document_id AND d.active_generation = c.generation"
)
WRITER_HEAP = 64_000_000  # bytes; one indexing thread
COMMIT_EVERY_S = 1.0  # at most one commit a second while changes arrive
POLL_S = 0.5
RESET = -1  # the log's seq of a dataset deleted whole (graphs.RESET)
K1, B = 1.2, 0.75  # Tantivy's BM25 (and FTS5's)
# A search asks for its best k / share · ASK_MARGIN + ASK_SLACK first (a candidate fails only when
# inactive, of another generation or filtered out), then ASK_WIDEN times as many when fewer than
# k of those pass: a longer list costs its sorting and its SQL.
ASK_MARGIN = 1.25
ASK_SLACK = 10
ASK_WIDEN = 8
ASK_MAX = 4000
_TOKEN = re.compile(r"[^\W_]+")
_MARKS = re.compile("[\u0300-\u036f]+")  # combining diacritics of Latin, Greek, Cyrillic


TOKENS_VERSION = 3  # 2: each term carries its dataset's key; 3: and its chunk's shard
SHARDS = 2  # the chunks split by seq % SHARDS, each shard's terms searched on a thread of its own
"""Bumped whenever `tokens`, `_terms` or SHARDS changes. With terms.TERMS_VERSION it names the
state table (and is kept in a scale-out replica's state), so an index made of other terms has
no state and is rebuilt."""


SEGMENT_CACHED_MAX = 64  # characters of a piece between spaces whose terms are kept …
SEGMENT_CACHE = 32_768  # … in so many pieces at most (about 10 MB full)


def tokens(text: str) -> list[str]:
    """The terms the index holds of a chunk's text: `index_text`'s, lower-cased, Latin
    diacritics removed (NFD, the marks dropped, NFC), split on what is not a letter or digit.

    Text with more than ASCII is taken a piece between spaces at a time, each piece's terms
    kept (a corpus repeats its words): the same terms, since a space ends every term and no
    canonical composition or reordering crosses it (it is a starter that composes with
    nothing); lower-casing, whose final sigma looks at its neighbours, is done first, whole."""
    lowered = index_text(text).lower()
    if lowered.isascii():
        return _TOKEN.findall(lowered)
    found: list[str] = []
    for segment in lowered.split(" "):
        if len(segment) > SEGMENT_CACHED_MAX:
            found.extend(_segment_tokens(segment))
        else:
            found.extend(_cached_segment_tokens(segment))
    return found


@functools.lru_cache(maxsize=SEGMENT_CACHE)
def _cached_segment_tokens(segment: str) -> tuple[str, ...]:
    return _segment_tokens(segment)


def _segment_tokens(segment: str) -> tuple[str, ...]:
    if not segment.isascii():
        bare = _MARKS.sub("", unicodedata.normalize("NFD", segment))
        segment = unicodedata.normalize("NFC", bare)
    return tuple(_TOKEN.findall(segment))


def query_tokens(terms: Iterable[str]) -> list[str]:
    """`terms.query_terms` as index terms (a term may split in two: "e-mail")."""
    found: list[str] = []
    for term in terms:
        found.extend(tokens(term))
    return list(dict.fromkeys(found))


def _prefix(key: int, shard: int) -> str:
    """What the index's terms of the dataset `key` in `shard` begin with: its key as unsigned
    hex, then the shard."""
    return f"{key & 0xFFFF_FFFF_FFFF_FFFF:x}.{shard}:"


def shard_of(seq: int) -> int:
    return seq % SHARDS


def _terms(key: int, seq: int, words: Iterable[str]) -> list[str]:
    """The index's terms for `words` of the chunk `seq` of the dataset `key`."""
    prefix = _prefix(key, shard_of(seq))
    return [prefix + word for word in words]


def idf(doc_freq: int, docs: int) -> float:
    """Tantivy's BM25 idf of a term `doc_freq` of `docs` documents hold."""
    return math.log(1.0 + (docs - doc_freq + 0.5) / (doc_freq + 0.5))


SHARD_THREADS = 8  # per shard searched beside the searching thread's, for the whole process
_shard_pools: dict[int, ThreadPoolExecutor] = {}


def _shard_pool() -> ThreadPoolExecutor:
    """The threads that search every shard but the first (which the searching thread takes), for
    the searches of every index of this process (searches that arrive together queue for them).
    One per process id: a pool whose threads were started before a fork has none in the child."""
    pid = os.getpid()
    pool = _shard_pools.get(pid)
    if pool is None:
        made = ThreadPoolExecutor(
            SHARD_THREADS * max(SHARDS - 1, 1), thread_name_prefix="kops-keywords"
        )
        pool = _shard_pools.setdefault(pid, made)  # a pool made beside it holds no thread yet
    return pool


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False, tokenizer_name="whitespace", index_option="freq")
    builder.add_integer_field("seq", indexed=True, fast=True)
    builder.add_integer_field("dataset", indexed=True)
    return builder.build()


Position = tuple[int, int]
"""How far an index got in its log: every change at or before it is applied. SQLite's log is in
commit order, so its position is (0, the last row's id); PostgreSQL's is (transaction id, id)."""


class LogPruned(Exception):
    """The log no longer holds every change after the index's position: it is built again."""


@dataclass(frozen=True)
class Change:
    position: Position
    key: int  # the dataset's key
    seq: int  # RESET: the whole dataset
    added: bool


@dataclass(frozen=True)
class Saved:
    """What a committed index holds: the last change applied, and its chunks' and terms' counts
    (the mean length that the pending chunks' BM25 needs)."""

    position: Position
    docs: int
    tokens: int


class ChangeLog(Protocol):
    """Where a keyword index reads the database's changes, and where it keeps how far it got."""

    def saved(self) -> Saved | None:
        """The state saved after the index's last commit; None: there is none to open."""

    def save(self, state: Saved) -> None:
        """Record `state`, after the index's commit that holds it."""

    def start_build(self) -> Position:
        """Forget the saved state (a build is not an index until it commits) and give the
        position from which the changes must be applied to an index of what the database holds
        from now on."""

    def active_chunks(self) -> Iterator[Sequence[tuple[int, str, str]]]:
        """Every active chunk as (seq, dataset id, text), in batches, from one read."""

    def changes(self, after: Position, limit: int) -> tuple[list[Change], dict[int, str]]:
        """The next changes after `after` that are final (in order), and the text of every
        chunk they add that the database still holds. Raises LogPruned when some of them are
        gone."""

    def pending(
        self, conn: Connection, key: int, after: Position, limit: int
    ) -> list[tuple[int, bool]]:
        """(seq, added) of the dataset's changes after `after` that `conn` sees, in order."""

    def texts(self, conn: Connection, seqs: Sequence[int]) -> dict[int, str]:
        """The text of each chunk of `seqs` that `conn` sees."""

    def newer(self, after: Position) -> bool:
        """Whether a change after `after` is visible now."""


TABLE_CHUNKS_TTL_S = 60.0  # how long the table's count of active chunks is trusted


class TableChunks:
    """How many active chunks the whole table holds, counted again every minute: the keyword
    index is made once it reaches KEYWORD_MIN_CHUNKS."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._counted: tuple[float, int] = (-TABLE_CHUNKS_TTL_S, 0)  # (when, how many)

    def count(self) -> int:
        when, count = self._counted
        if time.monotonic() - when >= TABLE_CHUNKS_TTL_S:
            with self.db.read() as conn:
                count = int(
                    conn.exec_driver_sql(
                        "SELECT coalesce(sum(chunk_count), 0) FROM documents "
                        "WHERE active_generation IS NOT NULL"
                    ).scalar()
                    or 0
                )
            self._counted = (time.monotonic(), count)
        return count


def asks(k: int, share: float) -> tuple[int, ...]:
    """How many candidates a search asks the index for, in turn, for k results when `share` of
    the dataset passes its filter (1.0: no filter): a list just longer than k first, a wider one
    when too few of it pass."""
    first = min(math.ceil(k * ASK_MARGIN / max(share, 1e-9)) + ASK_SLACK, ASK_MAX)
    wider = min(first * ASK_WIDEN, ASK_MAX)
    return (first,) if wider <= first else (first, wider)


@dataclass(frozen=True)
class Candidates:
    scored: list[tuple[int, float]]  # (seq, BM25), best first
    ranked: int  # how many the index itself returned (fewer than asked: every match was seen,
    # of every word of the question: Keywords.candidates)


@dataclass(frozen=True)
class View:
    """A committed state of the index: its searcher and the last change it holds."""

    searcher: tantivy.Searcher
    applied: Position
    mean_tokens: float  # of the chunks indexed, for the pending chunks' BM25


class Keywords:
    """A Tantivy index of a database's active chunks, and the thread that keeps it."""

    def __init__(self, changes: ChangeLog, folder: Path | None) -> None:
        self.changes = changes
        self.folder = folder
        self.schema = _schema()
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._view: View | None = None
        self._docs = 0
        self._tokens = 0
        self._lock = threading.Lock()  # the thread's start and stop
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.builds = 0  # indexes built from the database (not opened): tests and bench

    # --- searches -------------------------------------------------------------------------------
    def want(self) -> None:
        """Build (or open) the index and follow the log, from now on."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="kops-keywords", daemon=True)
                self._thread.start()
        self._wake.set()

    @property
    def ready(self) -> bool:
        return self._view is not None

    def candidates(
        self, conn: Connection, key: int, terms: Sequence[str], want: int
    ) -> Candidates | None:
        """(seq, BM25) of the dataset `key`'s best `want` chunks for `terms`, and of the chunks
        logged as added since the last commit that hold one of them, read in `conn`'s
        transaction. None when the index is not ready or too far behind (the engine's own
        full-text search answers). The question's rarest words find the candidates and every
        word scores them (rarest_first.py); when those words match fewer than `want` chunks,
        the plain disjunction of the words within the postings budget answers, and of every
        word when that is short too, so a short list still means every chunk holding a word of
        the question was seen."""
        view = self._view
        if view is None:
            self.want()
            return None
        every = query_tokens(terms)
        if not every:
            return Candidates([], 0)
        pending = self.changes.pending(conn, key, view.applied, PENDING_MAX + 1)
        if pending:
            self._wake.set()
        if len(pending) > PENDING_MAX or any(seq == RESET for seq, _ in pending):
            return None
        freqs = self._doc_freqs(view, key, every)
        chunks = view.searcher.doc_freq("dataset", key)
        settled = False
        if rarest_first.RESCORE:
            rare = self._rarest(every, freqs, chunks, rarest_first.CANDIDATE_POSTINGS_PER_CHUNK)
            words, found = every, self._search(view, key, rare, every, want, freqs)
            # short of `want`, the rarest words hold too few chunks, and chunks of the other
            # words alone may belong (unless every word was asked: every match was seen)
            settled = len(found) >= want or len(rare) == len(every)
        if not settled:  # the plain disjunction of the rarest words a search may read …
            words = self._rarest(every, freqs, chunks)
            found = self._search(view, key, words, words, want, freqs)
            if len(found) < want and len(words) < len(every):
                # … and of every word when that is short: the words left out may hold chunks
                # these do not (under a filter)
                words = every
                found = self._search(view, key, every, every, want, freqs)
        scored = dict(found)
        added = [seq for seq, is_added in pending if is_added]
        scored.update(self._score_pending(conn, view, key, words, added, freqs))
        best = sorted(scored.items(), key=lambda item: (-item[1], item[0]))
        return Candidates(best, len(found))

    def _doc_freqs(self, view: View, key: int, words: list[str]) -> dict[str, tuple[int, ...]]:
        """How many of the dataset `key`'s indexed chunks hold each word, shard by shard."""
        prefixes = [_prefix(key, shard) for shard in range(SHARDS)]
        return {
            word: tuple(view.searcher.doc_freq("text", prefix + word) for prefix in prefixes)
            for word in words
        }

    def _search(
        self,
        view: View,
        key: int,
        rare: list[str],
        words: list[str],
        want: int,
        freqs: dict[str, tuple[int, ...]],
    ) -> list[tuple[int, float]]:
        """(seq, BM25 of `words`) of the dataset `key`'s best `want` chunks in the index that
        hold one of `rare` (rarest_first.py; `rare` is `words`: the plain disjunction): each
        shard's best `want`, searched at once, the best `want` of them kept.

        In a shard, Tantivy weighs a word by the idf of the shard's count of chunks holding it;
        its term is boosted by the whole count's idf over that one, so that every shard scores
        a chunk as one index of every chunk would (up to float rounding: Tantivy counts deleted
        documents not merged away yet in its total, which `num_docs` leaves out; the boost moves
        by a small fraction of a percent for a tenth of the index deleted)."""
        docs = max(view.searcher.num_docs, 1)
        asked = set(rare)
        shards = []
        for shard in range(SHARDS):
            prefix = _prefix(key, shard)
            parts: tuple[list[tantivy.Query], list[tantivy.Query]] = ([], [])
            for word in words:
                held = freqs[word][shard]
                if held == 0:
                    continue
                term = tantivy.Query.term_query(self.schema, "text", prefix + word)
                boost = idf(sum(freqs[word]), docs) / idf(held, docs)
                parts[word not in asked].append(tantivy.Query.boost_query(term, boost))
            if parts[0]:
                shards.append(parts)
        if not shards:
            return []
        pool = _shard_pool()
        others = [
            pool.submit(rarest_first.best, view.searcher, self.schema, *parts, want)
            for parts in shards[1:]
        ]
        found = rarest_first.best(view.searcher, self.schema, *shards[0], want)
        for other in others:
            found.extend(other.result())
        found.sort(key=lambda item: (-item[1], item[0]))
        return found[:want]

    @staticmethod
    def _rarest(
        words: list[str],
        freqs: dict[str, tuple[int, ...]],
        chunks: int,
        per_chunk: float | None = None,
    ) -> list[str]:
        """The rarest of the question's `words` (terms.rarest_terms), by the index's counts: as
        many as hold `per_chunk` postings a chunk of the dataset's `chunks` together (the
        postings a search may read: terms.QUERY_POSTINGS_PER_CHUNK)."""
        if len(words) < 2:
            return words
        return rarest_terms(words, lambda word: sum(freqs[word]), chunks, per_chunk)

    def _score_pending(
        self,
        conn: Connection,
        view: View,
        key: int,
        words: list[str],
        seqs: list[int],
        freqs: dict[str, tuple[int, ...]],
    ) -> dict[int, float]:
        """BM25 as Tantivy computes it (its idf, k1 1.2, b 0.75), with the index's document
        counts (the dataset's for a word, all for the total) and mean length, for chunks of the
        dataset `key` the index does not hold yet."""
        if not seqs:
            return {}
        held = {seq: tokens(body) for seq, body in self.changes.texts(conn, seqs).items()}
        # the statistics as they will be once these chunks are in the index
        total = view.searcher.num_docs + len(held)
        weights = {
            word: idf(sum(freqs[word]) + sum(word in t for t in held.values()), total)
            for word in words
        }
        scored: dict[int, float] = {}
        for seq, terms in held.items():
            counts: dict[str, int] = {}
            for term in terms:
                if term in weights:
                    counts[term] = counts.get(term, 0) + 1
            if not counts:
                continue
            norm = K1 * (1.0 - B + B * len(terms) / max(view.mean_tokens, 1.0))
            scored[seq] = sum(
                weights[word] * tf * (K1 + 1.0) / (tf + norm) for word, tf in counts.items()
            )
        return scored

    def caught_up(self, timeout: float = 600.0) -> bool:
        """Wait until the index exists and holds the whole log (tests, bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self._view
            if view is not None and not self.changes.newer(view.applied):
                return True
            self._wake.set()
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """Stop the thread; what is committed stays (the next start opens it)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=120)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.wait_merging_threads()

    # --- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._view is None and not self._open():
                    self._build()
                applied = self._apply() if self._view is not None else 0
            except LogPruned:
                log.warning("the keyword log was pruned past the keyword index: rebuilding it")
                self._discard()
                continue
            except Exception:  # the database busy or gone a moment, a disk full: try again
                log.exception("keeping the keyword index failed; trying again")
                self._stop.wait(1.0)
                continue
            if applied >= APPLY_BATCH:  # behind: on at once
                continue
            if applied:  # changes arrive: gather a second's worth into the next commit
                self._stop.wait(COMMIT_EVERY_S)
                continue
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _open(self) -> bool:
        """The committed index on disk, when there is one and its state was saved after its
        commit: then the changes after that are applied."""
        state = self.changes.saved()
        if state is None or self.folder is None or not self.folder.is_dir():
            return False
        if not tantivy.Index.exists(str(self.folder)):
            return False
        try:
            index = tantivy.Index.open(str(self.folder))
            index.searcher()
        except Exception as exc:
            log.warning("the keyword index in %s does not open (%s): rebuilding", self.folder, exc)
            return False
        writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)  # busy: raises, tried again
        self._index, self._writer = index, writer
        self._docs, self._tokens = state.docs, state.tokens
        self._publish(state.position)
        return True

    def _build(self) -> None:
        """The index of every active chunk as the database holds it now; the changes after the
        position taken first are applied next (some twice: harmless)."""
        top = self.changes.start_build()
        index = self._fresh()
        writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        docs = words = 0
        keys: dict[str, int] = {}
        for batch in self.changes.active_chunks():
            if self._stop.is_set():
                return
            for seq, dataset, body in batch:
                key = keys.get(dataset)
                if key is None:
                    key = keys[dataset] = dataset_key(dataset)
                held = tokens(body)
                writer.add_document(
                    tantivy.Document(
                        text=" ".join(_terms(key, int(seq), held)), seq=int(seq), dataset=key
                    )
                )
                docs += 1
                words += len(held)
        writer.commit()
        self._index, self._writer = index, writer
        self._docs, self._tokens = docs, words
        self.changes.save(Saved(top, docs, words))
        self._publish(top)
        self.builds += 1

    def _discard(self) -> None:
        """Forget the index in this process (searches go to the engine's own full-text search
        until the next build commits)."""
        self._view = None
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.wait_merging_threads()
        self._index = None

    def _fresh(self) -> tantivy.Index:
        if self.folder is None:
            return tantivy.Index(self.schema)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        return tantivy.Index(self.schema, path=str(self.folder))

    def _apply(self) -> int:
        """Apply the next changes and commit; how many there were."""
        view, index = self._view, self._index
        assert view is not None
        assert index is not None
        if self._writer is None:  # closed (close()) and followed again
            self._writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        writer = self._writer
        rows, texts = self.changes.changes(view.applied, APPLY_BATCH)
        if not rows:
            return 0
        for change in rows:
            if change.seq == RESET:
                writer.delete_documents_by_term("dataset", change.key)
                continue
            writer.delete_documents_by_term("seq", change.seq)
            body = texts.get(change.seq) if change.added else None
            if body is not None:  # an add whose chunk is gone since: a later change removes it
                held = tokens(body)
                writer.add_document(
                    tantivy.Document(
                        text=" ".join(_terms(change.key, change.seq, held)),
                        seq=change.seq,
                        dataset=change.key,
                    )
                )
                self._docs += 1
                self._tokens += len(held)
        writer.commit()
        applied = rows[-1].position
        self.changes.save(Saved(applied, self._docs, self._tokens))
        self._publish(applied)
        return len(rows)

    def _publish(self, applied: Position) -> None:
        assert self._index is not None
        self._index.reload()
        mean = self._tokens / self._docs if self._docs else 1.0
        self._view = View(self._index.searcher(), applied, mean)


# --- the embedded index's log: tables of its SQLite database ------------------------------------
def terms_version() -> str:
    """The versions of the terms an index is made of (TOKENS_VERSION)."""
    return f"t{TERMS_VERSION}k{TOKENS_VERSION}"


def state_table(vec: str) -> str:
    return f"{vec}_keywords_{terms_version()}"


def create_table(conn: Connection, vec: str) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {state_table(vec)} (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "log_id INTEGER NOT NULL, docs INTEGER NOT NULL, tokens INTEGER NOT NULL)"
    )


BUILDING = -1  # the state row's counts while a build has not committed


class SqliteChanges:
    """The embedded index's vector log (`<vector table>_log`, written by `SqliteIndex` in the
    changes' own transactions; one writer at a time, so its ids are in commit order), and the
    state row (`<vector table>_keywords_…`) after whose log id the graphs' pruning keeps every
    row."""

    def __init__(self, db: Database, vec: str, log_table: str) -> None:
        self.db = db
        self.log = log_table
        self.state = state_table(vec)

    def saved(self) -> Saved | None:
        with self.db.read() as conn:
            row = conn.exec_driver_sql(f"SELECT log_id, docs, tokens FROM {self.state}").first()
        if row is None or int(row[1]) == BUILDING:
            return None
        return Saved((0, int(row[0])), int(row[1]), int(row[2]))

    def save(self, state: Saved) -> None:
        with self.db.write() as tx:
            self._write(tx, state)

    def _write(self, tx: Connection, state: Saved) -> None:
        tx.exec_driver_sql(
            f"INSERT INTO {self.state} (id, log_id, docs, tokens) VALUES (1, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET log_id = excluded.log_id, docs = excluded.docs, "
            "tokens = excluded.tokens",
            (state.position[1], state.docs, state.tokens),
        )

    def start_build(self) -> Position:
        with self.db.write() as tx:  # from here the graphs keep every newer log row
            top = int(
                tx.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {self.log}").scalar() or 0
            )
            self._write(tx, Saved((0, top), BUILDING, BUILDING))
        return (0, top)

    def active_chunks(self) -> Iterator[Sequence[tuple[int, str, str]]]:
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(ACTIVE_CHUNKS)
            while batch := rows.fetchmany(READ_BATCH):
                yield [(int(seq), str(dataset), str(body)) for seq, dataset, body in batch]

    def changes(self, after: Position, limit: int) -> tuple[list[Change], dict[int, str]]:
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id, dataset_key, seq, added FROM {self.log} WHERE id > ? "
                "ORDER BY id LIMIT ?",
                (after[1], limit),
            ).all()
            found = [
                Change((0, int(row_id)), int(key), int(seq), bool(added))
                for row_id, key, seq, added in rows
            ]
            return found, self.texts(conn, [change.seq for change in found if change.added])

    def pending(
        self, conn: Connection, key: int, after: Position, limit: int
    ) -> list[tuple[int, bool]]:
        rows = conn.exec_driver_sql(
            f"SELECT seq, added FROM {self.log} WHERE dataset_key = ? AND id > ? "
            "ORDER BY id LIMIT ?",
            (key, after[1], limit),
        ).all()
        return [(int(seq), bool(added)) for seq, added in rows]

    def texts(self, conn: Connection, seqs: Sequence[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        unique = list(dict.fromkeys(seqs))
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = conn.exec_driver_sql(
                f"SELECT seq, text FROM chunks WHERE seq IN ({marks})", tuple(part)
            )
            found.update({int(seq): str(body) for seq, body in rows})
        return found

    def newer(self, after: Position) -> bool:
        with self.db.read() as conn:
            row = conn.exec_driver_sql(
                f"SELECT 1 FROM {self.log} WHERE id > ? LIMIT 1", (after[1],)
            ).first()
        return row is not None
