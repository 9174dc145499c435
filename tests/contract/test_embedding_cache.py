"""One contract for every EmbeddingCache: memory, SQLite, PostgreSQL and Redis behave the same."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from sqlalchemy import func, select

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import embedding_cache
from knowledgeops.ingest.embedders.cache import (
    CACHE_VERSION,
    EmbeddingCache,
    MemoryEmbeddingCache,
    RedisEmbeddingCache,
    SqlEmbeddingCache,
    Vector,
)
from knowledgeops.ingest.index.base import text_hash
from knowledgeops.lab.embedders import HashingEmbedder

from ..conftest import unavailable

REDIS_URL = os.environ.get("KOPS_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
EMBED = HashingEmbedder(dimension=32)
MODEL = "test/model-a"


def vectors_for(texts: list[str]) -> dict[str, Vector]:
    return {text_hash(t): EMBED.vector(t) for t in texts}


@pytest.fixture
def redis_cache() -> Iterator[RedisEmbeddingCache]:
    """A cache under a prefix of its own; its keys (and only those) are deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable(f"Redis is not reachable: {type(exc).__name__}: {exc}")
    prefix = f"kops:test:{uuid.uuid4().hex[:12]}"
    cache = RedisEmbeddingCache(REDIS_URL, prefix=prefix)
    yield cache
    cache.close()
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.close()


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def cache(request: pytest.FixtureRequest) -> EmbeddingCache:
    if request.param == "memory":
        return MemoryEmbeddingCache()
    if request.param == "redis":
        redis_cache: RedisEmbeddingCache = request.getfixturevalue("redis_cache")
        return redis_cache
    db: Database = request.getfixturevalue(f"{request.param}_db")
    return SqlEmbeddingCache(db)


def test_a_miss_then_a_hit_returns_the_stored_vectors(cache: EmbeddingCache) -> None:
    stored = vectors_for(["ownership moves values", "borrowing refers to values"])
    assert cache.get_many(MODEL, list(stored)) == {}
    cache.put_many(MODEL, stored)
    found = cache.get_many(MODEL, list(stored))
    assert set(found) == set(stored)
    for h, vector in stored.items():
        assert found[h].dtype == np.float32
        np.testing.assert_array_equal(found[h], vector)


def test_only_hits_are_returned(cache: EmbeddingCache) -> None:
    stored = vectors_for(["known text"])
    cache.put_many(MODEL, stored)
    unknown = text_hash("unknown text")
    assert set(cache.get_many(MODEL, [unknown, *stored, unknown])) == set(stored)


def test_model_ids_are_separate_namespaces(cache: EmbeddingCache) -> None:
    stored = vectors_for(["the same text for two models"])
    cache.put_many(MODEL, stored)
    assert cache.get_many("test/model-b", list(stored)) == {}
    other = {h: -v for h, v in stored.items()}
    cache.put_many("test/model-b", other)
    (h,) = stored
    np.testing.assert_array_equal(cache.get_many(MODEL, [h])[h], stored[h])
    np.testing.assert_array_equal(cache.get_many("test/model-b", [h])[h], other[h])


def test_putting_an_existing_key_again_is_harmless(cache: EmbeddingCache) -> None:
    stored = vectors_for(["stored twice", "stored once"])
    cache.put_many(MODEL, stored)
    cache.put_many(MODEL, stored)
    cache.put_many(MODEL, {**stored, **vectors_for(["new in the second put"])})
    found = cache.get_many(MODEL, [*stored, text_hash("new in the second put")])
    assert len(found) == 3
    for h, vector in stored.items():
        np.testing.assert_array_equal(found[h], vector)


def test_many_keys_round_trip(cache: EmbeddingCache) -> None:
    stored = vectors_for([f"text number {n} of many" for n in range(1234)])
    cache.put_many(MODEL, stored)
    found = cache.get_many(MODEL, list(stored))
    assert set(found) == set(stored)
    for h, vector in stored.items():
        np.testing.assert_array_equal(found[h], vector)


def test_empty_inputs(cache: EmbeddingCache) -> None:
    cache.put_many(MODEL, {})
    assert cache.get_many(MODEL, []) == {}


def test_the_sql_cache_keeps_one_row_per_key(sqlite_db: Database) -> None:
    cache = SqlEmbeddingCache(sqlite_db)
    stored = vectors_for(["one row"])
    cache.put_many(MODEL, stored)
    cache.put_many(MODEL, stored)
    with sqlite_db.read() as conn:
        rows = conn.execute(
            select(embedding_cache.c.model_id, func.count()).group_by(embedding_cache.c.model_id)
        ).all()
    assert [tuple(r) for r in rows] == [(f"v{CACHE_VERSION}:{MODEL}", 1)]


def test_redis_keys_carry_the_version_and_the_model_id(redis_cache: RedisEmbeddingCache) -> None:
    stored = vectors_for(["a text to find by key"])
    redis_cache.put_many(MODEL, stored)
    (h,) = stored
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = {k.decode() for k in client.scan_iter(match=f"{redis_cache.key_prefix}:*")}
        key = f"{redis_cache.key_prefix}:v{CACHE_VERSION}:{MODEL}:{h}"
        assert keys == {key}
        assert 0 < client.ttl(key) <= 30 * 24 * 3600
    finally:
        client.close()


def test_an_unreachable_redis_gives_misses_quickly(caplog: pytest.LogCaptureFixture) -> None:
    # No cool-down, so every call really tries the port where nothing listens.
    cache = RedisEmbeddingCache(
        "redis://:secret-password@127.0.0.1:1/0", prefix="kops:none", cooldown_s=0.0
    )
    stored = vectors_for(["nothing is stored", "anywhere"])
    started = time.monotonic()
    for _ in range(3):
        cache.put_many(MODEL, stored)
        assert cache.get_many(MODEL, list(stored)) == {}
    assert time.monotonic() - started < 5.0
    warnings = [r for r in caplog.records if r.name == "knowledgeops.ingest.embedders.cache"]
    assert len(warnings) == 1  # once per minute, not once per call
    assert "secret-password" not in caplog.text
    cache.close()


def test_after_a_redis_error_the_cache_is_left_alone_for_a_while() -> None:
    cache = RedisEmbeddingCache("redis://127.0.0.1:1/0", prefix="kops:none", cooldown_s=60.0)
    stored = vectors_for(["a text"])
    assert cache.get_many(MODEL, list(stored)) == {}  # fails, starts the cool-down
    cache._client.close()
    cache._client = None  # type: ignore[assignment]  # any use of the client would raise now
    cache.put_many(MODEL, stored)
    assert cache.get_many(MODEL, list(stored)) == {}
