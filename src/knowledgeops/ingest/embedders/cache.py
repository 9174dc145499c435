"""An embedding cache keyed by (model id, sha256 of the text): re-ingesting known text costs no
model calls (docs/architecture.md: Embedding and search).

`CachedEmbedder` wraps any `Embedder` and asks an `EmbeddingCache` first. Three caches share one
small protocol and one contract suite: in memory (tests, one process), SQL (the service's own
database, SQLite or PostgreSQL: nothing more to run) and Redis (shared by scaled-out workers).

Every key carries `CACHE_VERSION` and the model id, so a new model or a new vector format can
never be answered with an old vector; the two are joined into one namespace string, which the SQL
cache stores in its `model_id` column. Vectors are stored as little-endian float32 bytes.

The SQL cache is the database the jobs write to, so its errors are the job's errors. Redis is a
separate service and only an optimisation (docs/architecture.md: Two topologies): when it fails,
reads are misses and writes are skipped, with a warning at most once a minute, and it is left
alone for a few seconds so that a Redis that hangs costs one timeout, not one per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from knowledgeops.clock import utcnow
from knowledgeops.db.schema import embedding_cache
from knowledgeops.ingest.embedders.base import Embedder, Fronting, Vectors
from knowledgeops.ingest.index.base import text_hash

if TYPE_CHECKING:
    import redis

    from knowledgeops.db.engine import Database

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the stored vector format changes; it is part of every key
PART = 500  # keys per IN list, MGET or pipeline
REDIS_TTL_S = 30 * 24 * 3600  # 30 days
REDIS_TIMEOUT_S = 1.0
WARN_EVERY_S = 60.0
REDIS_COOLDOWN_S = 5.0  # after a Redis error, answer without it for this long

Vector = npt.NDArray[np.float32]
_STORED = np.dtype("<f4")
_T = TypeVar("_T")


class EmbeddingCache(Protocol):
    def get_many(self, model_id: str, hashes: Sequence[str]) -> dict[str, Vector]:
        """The cached vectors among `hashes` (only the hits), by hash."""
        ...

    def put_many(self, model_id: str, vectors: Mapping[str, Vector]) -> None:
        """Store vectors by hash; a key that is already stored keeps its vector."""
        ...


def namespace(model_id: str) -> str:
    """The cache version and the model id: the part of every key before the text hash."""
    return f"v{CACHE_VERSION}:{model_id}"


def to_bytes(vector: Vector) -> bytes:
    return np.ascontiguousarray(vector, dtype=_STORED).tobytes()


def from_bytes(data: bytes) -> Vector | None:
    """The stored vector, or None for bytes that cannot be one (treated as a miss)."""
    if not data or len(data) % _STORED.itemsize:
        return None
    return np.frombuffer(data, dtype=_STORED).astype(np.float32)


def parts(items: Sequence[_T], size: int = PART) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MemoryEmbeddingCache:
    """A dict behind a lock; vectors are copied in and out, so no caller can change another's."""

    def __init__(self) -> None:
        self._vectors: dict[tuple[str, str], Vector] = {}
        self._lock = threading.Lock()

    def get_many(self, model_id: str, hashes: Sequence[str]) -> dict[str, Vector]:
        ns = namespace(model_id)
        with self._lock:
            found = {h: self._vectors.get((ns, h)) for h in hashes}
        return {h: v.copy() for h, v in found.items() if v is not None}

    def put_many(self, model_id: str, vectors: Mapping[str, Vector]) -> None:
        ns = namespace(model_id)
        copies = {h: np.array(v, dtype=np.float32) for h, v in vectors.items()}
        with self._lock:
            for h, v in copies.items():
                self._vectors.setdefault((ns, h), v)

    def __len__(self) -> int:
        with self._lock:
            return len(self._vectors)


class SqlEmbeddingCache:
    """The `embedding_cache` table, on SQLite or PostgreSQL. Writes use their own short
    transaction and ON CONFLICT DO NOTHING, so two workers storing the same text never conflict."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get_many(self, model_id: str, hashes: Sequence[str]) -> dict[str, Vector]:
        wanted = list(dict.fromkeys(hashes))
        if not wanted:
            return {}
        ns = namespace(model_id)
        found: dict[str, Vector] = {}
        t = embedding_cache.c
        with self.db.read() as conn:
            for part in parts(wanted):
                rows = conn.execute(
                    select(t.text_hash, t.vector).where(t.model_id == ns, t.text_hash.in_(part))
                )
                for row in rows:
                    vector = from_bytes(row.vector)
                    if vector is not None:
                        found[row.text_hash] = vector
        return found

    def put_many(self, model_id: str, vectors: Mapping[str, Vector]) -> None:
        if not vectors:
            return
        ns = namespace(model_id)
        now = utcnow()
        rows = [
            {"model_id": ns, "text_hash": h, "vector": to_bytes(v), "created_at": now}
            for h, v in sorted(vectors.items())  # one key order: no deadlock between writers
        ]
        statement = self._insert().on_conflict_do_nothing(index_elements=["model_id", "text_hash"])
        with self.db.write() as conn:
            for part in parts(rows):
                conn.execute(statement, list(part))

    def _insert(self) -> Any:
        if self.db.dialect == "postgresql":
            return pg_insert(embedding_cache)
        if self.db.dialect == "sqlite":
            return sqlite_insert(embedding_cache)
        raise ValueError(
            f"the embedding cache supports SQLite and PostgreSQL, not {self.db.dialect}"
        )


class _Throttle:
    """Says yes at most once per `every_s`, and counts the times it said no in between."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: float | None = None
        self._suppressed = 0
        self._lock = threading.Lock()

    def ready(self) -> int | None:
        """None when it is too soon; otherwise how many were suppressed since the last yes."""
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < self.every_s:
                self._suppressed += 1
                return None
            self._last = now
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed


class RedisEmbeddingCache:
    """Redis keys `{prefix}:v{CACHE_VERSION}:{model_id}:{text_hash}` holding float32 bytes, with a
    TTL. Best effort: a Redis error is a miss (read) or a skip (write), never an exception."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "kops:emb",
        ttl_s: int = REDIS_TTL_S,
        cooldown_s: float = REDIS_COOLDOWN_S,
    ) -> None:

        # One try per call: a miss costs less than waiting for a cache. The URL is never logged
        # (it may carry a password).
        self._client: redis.Redis = redis.Redis.from_url(
            url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        self._prefix = prefix
        self.ttl_s = ttl_s
        self.cooldown_s = cooldown_s
        self._warn = _Throttle(WARN_EVERY_S)
        self._skip_until = 0.0

    @property
    def key_prefix(self) -> str:
        """The part of every key before the model id's namespace: `{prefix}`."""
        return self._prefix

    def key(self, model_id: str, digest: str) -> str:
        return f"{self._prefix}:{namespace(model_id)}:{digest}"

    def get_many(self, model_id: str, hashes: Sequence[str]) -> dict[str, Vector]:
        wanted = list(dict.fromkeys(hashes))
        if not wanted or self._cooling_down():
            return {}

        found: dict[str, Vector] = {}
        try:
            for part in parts(wanted):
                keys = [self.key(model_id, h) for h in part]
                values = cast("list[bytes | None]", self._client.mget(keys))
                for h, data in zip(part, values, strict=True):
                    vector = None if data is None else from_bytes(data)
                    if vector is not None:
                        found[h] = vector
        except redis.RedisError as exc:
            self._failed("read", exc)
            return {}
        return found

    def put_many(self, model_id: str, vectors: Mapping[str, Vector]) -> None:
        if not vectors or self._cooling_down():
            return

        items = list(vectors.items())
        try:
            for part in parts(items):
                pipe = self._client.pipeline(transaction=False)
                for h, v in part:
                    pipe.set(self.key(model_id, h), to_bytes(v), ex=self.ttl_s)
                pipe.execute()
        except redis.RedisError as exc:
            self._failed("write", exc)

    def close(self) -> None:
        self._client.close()

    def _cooling_down(self) -> bool:
        return time.monotonic() < self._skip_until

    def _failed(self, what: str, exc: Exception) -> None:
        self._skip_until = time.monotonic() + self.cooldown_s
        suppressed = self._warn.ready()
        if suppressed is None:
            return
        more = f" ({suppressed} more errors since the last warning)" if suppressed else ""
        log.warning(
            "embedding cache: Redis %s failed, going on without the cache: %s: %s%s",
            what,
            type(exc).__name__,
            exc,
            more,
        )


class CachedEmbedder(Fronting):
    """An `Embedder` that asks `cache` first and embeds only what it lacks, in one inner call.

    `hits` and `misses` count distinct texts per call: a hit came from the cache, a miss went to
    the inner embedder (so `misses` is also the number of texts the model was given).
    """

    def __init__(self, inner: Embedder, cache: EmbeddingCache) -> None:
        super().__init__(inner)
        self.cache = cache
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: Sequence[str]) -> tuple[Vectors, int]:
        """The vectors, and how many distinct texts the inner embedder was given for them."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32), 0
        hashes = [text_hash(t) for t in texts]
        text_of = dict(zip(hashes, texts, strict=True))  # distinct texts, first-seen order
        cached = {
            h: v
            for h, v in self.cache.get_many(self.model_id, list(text_of)).items()
            if v.shape == (self.dimension,)
        }
        missing = [h for h in text_of if h not in cached]
        fresh: dict[str, Vector] = {}
        if missing:
            vectors = np.asarray(self.inner.embed([text_of[h] for h in missing]), np.float32)
            if vectors.shape != (len(missing), self.dimension):
                raise ValueError(
                    f"{self.model_id} returned vectors of shape {vectors.shape} for "
                    f"{len(missing)} texts of dimension {self.dimension}"
                )
            fresh = dict(zip(missing, vectors, strict=True))
            self.cache.put_many(self.model_id, fresh)
        with self._lock:
            self.hits += len(cached)
            self.misses += len(missing)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for row, h in enumerate(hashes):
            out[row] = cached[h] if h in cached else fresh[h]
        return out, len(missing)
