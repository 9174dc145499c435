"""The OpenAI-compatible HTTP embedder against a real local HTTP server that serves embeddings and
fails, throttles, hangs or refuses keys on command; the shared concurrency limit on real Redis."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from knowledgeops.errors import (
    PermanentError,
    ServiceUnavailable,
    TransientError,
    UserActionRequired,
)
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.embedders.cache import CachedEmbedder
from knowledgeops.ingest.embedders.concurrency import LocalLimit, RedisLimit
from knowledgeops.ingest.embedders.openai import KeySource, OpenAIEmbedder, _retry_after
from knowledgeops.lab.devpg import free_port
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.lab.fakeprovider import ProviderState, create_provider_app, serve_in_thread
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from knowledgeops.service.views import JobView
from tests.conftest import unavailable, wait_for
from tests.e2e.corpus import long_text

TEXT = long_text("kettle", paragraphs=6, seed=11)

DIM = 384
SECRET = "sk-test-5ecr3t-key"
REDIS_URL = "redis://127.0.0.1:6379/14"


class SlowHashing(HashingEmbedder):
    """The test embedder, taking a moment per request so that requests overlap."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(dimension=DIM)
        self.delay_s = delay_s

    def embed(self, texts: Sequence[str]) -> Vectors:
        time.sleep(self.delay_s)
        return super().embed(texts)  # type: ignore[no-any-return]


class Provider:
    def __init__(self, url: str, state: ProviderState, embedder: SlowHashing) -> None:
        self.url = url
        self.state = state
        self.embedder = embedder

    def control(self, **body: Any) -> None:
        response = httpx.post(self.url.removesuffix("/v1") + "/_control", json=body)
        assert response.status_code == 200, response.text

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url.removesuffix("/v1") + "/_stats").json())


@pytest.fixture
def provider() -> Iterator[Provider]:
    embedder = SlowHashing()
    state = ProviderState(keys={SECRET})
    with serve_in_thread(create_provider_app(embedder, state), free_port()) as url:
        yield Provider(url, state, embedder)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "provider.key"
    path.write_text(SECRET + "\n")
    return path


def make(provider: Provider, key_file: Path, **kwargs: Any) -> OpenAIEmbedder:
    options: dict[str, Any] = {"limit": LocalLimit(4), "timeout_s": 5.0}
    options.update(kwargs)
    return OpenAIEmbedder(
        base_url=provider.url,
        model="fake-minilm",
        dimension=DIM,
        keys=KeySource(key_file=key_file),
        **options,
    )


def test_vectors_come_back_in_order_and_of_unit_length(provider: Provider, key_file: Path) -> None:
    texts = ["ownership moves values", "borrowing lends them", "lifetimes bound references"]
    vectors = make(provider, key_file).embed(texts)
    assert vectors.shape == (3, DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(vectors, HashingEmbedder(dimension=DIM).embed(texts), atol=1e-6)


def test_429_is_transient_and_keeps_the_providers_retry_after(
    provider: Provider, key_file: Path
) -> None:
    provider.control(mode="throttle", count=1, retry_after=7)
    embedder = make(provider, key_file)
    with pytest.raises(TransientError) as caught:
        embedder.embed(["a"])
    assert (caught.value.code, caught.value.retry_after_s) == ("rate_limited", 7.0)
    assert embedder.embed(["a"]).shape == (1, DIM)  # the throttle is over


def test_5xx_timeouts_and_connection_errors_are_transient(
    provider: Provider, key_file: Path
) -> None:
    provider.control(mode="error500", count=1)
    with pytest.raises(TransientError, match=r"failed \(500\)"):
        make(provider, key_file).embed(["a"])
    provider.control(mode="hang", count=1)
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"did not answer within 0\.5 s") as caught:
        make(provider, key_file, timeout_s=0.5).embed(["a"])
    assert caught.value.code == "embedder_timeout"
    assert time.monotonic() - started < 5
    nowhere = OpenAIEmbedder(
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        model="m",
        dimension=DIM,
        keys=KeySource(key_file=key_file),
        limit=LocalLimit(1),
        timeout_s=2,
    )
    with pytest.raises(TransientError) as caught:
        nowhere.embed(["a"])
    assert caught.value.code == "embedder_unreachable"


def test_an_input_the_provider_cannot_embed_is_permanent(
    provider: Provider, key_file: Path
) -> None:
    provider.control(mode="bad_request", count=1)
    with pytest.raises(PermanentError) as caught:
        make(provider, key_file).embed(["a"])
    assert caught.value.code == "embedder_rejected"
    assert "non-empty list of strings" in caught.value.message  # the provider's own words


def test_a_wrong_dimension_setting_is_named(provider: Provider, key_file: Path) -> None:
    embedder = OpenAIEmbedder(
        base_url=provider.url,
        model="m",
        dimension=1536,
        keys=KeySource(key_file=key_file),
        limit=LocalLimit(1),
    )
    with pytest.raises(PermanentError, match="KOPS_OPENAI_DIMENSIONS is 1536"):
        embedder.embed(["a"])


def test_a_refused_key_needs_the_user_and_never_shows_up_anywhere(
    provider: Provider, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider.control(keys=["another-key"])
    with pytest.raises(UserActionRequired) as caught:
        make(provider, key_file).embed(["a"])
    assert caught.value.code == "embedder_auth"
    assert "KOPS_OPENAI_API_KEY_FILE" in caught.value.message
    assert SECRET not in caught.value.message
    assert SECRET not in caplog.text
    assert provider.stats()["refused"] == {"401": 1}  # re-read, same key: not sent again


def test_a_rotated_key_file_is_used_by_the_next_request_without_a_restart(
    provider: Provider, key_file: Path
) -> None:
    embedder = make(provider, key_file)
    embedder.embed(["a"])
    provider.control(keys=["sk-rotated-key-0002"])
    key_file.write_text("sk-rotated-key-0002\n")
    embedder.embed(["b"])
    assert provider.stats()["refused"] == {}


def test_after_a_401_the_key_file_is_read_once_more(provider: Provider, key_file: Path) -> None:
    """Even when the file's timestamps did not change (a copy that kept them), a refused key
    makes the embedder read the file again before it gives up."""
    embedder = make(provider, key_file)
    embedder.embed(["a"])
    stat = key_file.stat()
    rotated = "sk-test-5ecr3t-kez"  # same length: the size does not change either
    key_file.write_text(rotated + "\n")
    os.utime(key_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    provider.control(keys=[rotated])
    assert embedder.embed(["b"]).shape == (1, DIM)
    assert provider.stats()["refused"] == {"401": 1}


def test_a_missing_key_file_needs_the_user(provider: Provider, tmp_path: Path) -> None:
    embedder = make(provider, tmp_path / "absent.key")
    with pytest.raises(UserActionRequired) as caught:
        embedder.embed(["a"])
    assert caught.value.code == "embedder_key_missing"


def _hammer(embedders: list[OpenAIEmbedder], threads: int) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            embedders[n % len(embedders)].embed([f"text {n}"])
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(30)
    assert errors == []


@pytest.fixture
def limit_name() -> Iterator[Callable[[], RedisLimit]]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        unavailable(f"Redis is not reachable: {exc}")
    name = f"kops:limit:test:{os.getpid()}:{time.monotonic_ns()}"
    yield lambda: RedisLimit(REDIS_URL, 2, name=name, lease_s=30)
    client.delete(name)
    client.close()


def test_one_limit_is_shared_by_every_worker_process_through_redis(
    provider: Provider, key_file: Path, limit_name: Callable[[], RedisLimit]
) -> None:
    """Two embedders with their own Redis limit objects (as two processes would have) never
    have more than two requests at the provider at once."""
    provider.embedder.delay_s = 0.1
    embedders = [make(provider, key_file, limit=limit_name()) for _ in range(2)]
    _hammer(embedders, threads=10)
    stats = provider.stats()
    assert stats["served"] == 10
    assert stats["max_in_flight"] == 2
    assert limit_name().holders() == 0  # every slot was given back


def test_without_redis_each_process_falls_back_to_one_slot(
    provider: Provider, key_file: Path
) -> None:
    """Work goes on during a Redis outage, as slowly as it can: one request at a time here."""
    provider.embedder.delay_s = 0.05
    limit = RedisLimit("redis://127.0.0.1:1/0", 3, lease_s=30)
    _hammer([make(provider, key_file, limit=limit)], threads=6)
    stats = provider.stats()
    assert (stats["served"], stats["max_in_flight"]) == (6, 1)


# --- through the embedded runtime, as KOPS_EMBEDDER=openai ---------------------------------------


@pytest.fixture
def openai_runtime(
    make_runtime: Callable[..., EmbeddedRole], provider: Provider, key_file: Path
) -> EmbeddedRole:
    return make_runtime(
        from_settings="openai",
        workers=1,
        openai_base_url=provider.url,
        openai_model="fake-minilm",
        openai_dimensions=DIM,
        openai_api_key_file=key_file,
        openai_timeout_s=2,
        max_attempts=5,
    )


def _accept(runtime: EmbeddedRole, tmp_path: Path, name: str, text: str) -> str:
    staged = runtime.blobs.stage(10_000_000)
    staged.write(text.encode())
    accepted = runtime.service.uploads.accept(
        "default", staged, file_name=name, declared_type=None, dataset_id=None, idempotency_key=None
    )
    return accepted.job.id


def _finished(runtime: EmbeddedRole, job_id: str) -> JobView:
    def ended() -> JobView | None:
        job = runtime.service.jobs.get("default", job_id)
        return job if job.status in {"completed", "failed", "cancelled"} else None

    found: JobView = wait_for(ended, timeout=60, what=f"job {job_id} to end")
    return found


def test_documents_are_embedded_by_the_provider_and_searchable(
    openai_runtime: EmbeddedRole, provider: Provider, tmp_path: Path
) -> None:
    assert isinstance(openai_runtime.embedder, CachedEmbedder) is False  # tests run uncached
    job = _finished(openai_runtime, _accept(openai_runtime, tmp_path, "a.txt", TEXT))
    assert (job.status, job.processed_chunks) == ("completed", job.total_chunks)
    dataset = openai_runtime.service.datasets.ensure_default("default").id
    hits = openai_runtime.service.search.search(
        "default", dataset, "kettle", top_k=3, mode=SearchMode.VECTOR
    )
    assert hits
    assert provider.stats()["served"] >= 2  # the chunks and the query went to the provider


def test_throttling_then_recovery_retries_until_done(
    openai_runtime: EmbeddedRole, provider: Provider, tmp_path: Path
) -> None:
    provider.control(mode="throttle", count=2, retry_after=0.1)
    job = _finished(openai_runtime, _accept(openai_runtime, tmp_path, "a.txt", TEXT))
    assert job.status == "completed"
    assert job.retries == 2
    assert provider.stats()["refused"] == {"429": 2}


def test_a_refused_key_fails_the_job_for_the_user_and_retry_works_once_fixed(
    openai_runtime: EmbeddedRole, provider: Provider, key_file: Path, tmp_path: Path
) -> None:
    provider.control(keys=["sk-the-new-key"])
    job = _finished(openai_runtime, _accept(openai_runtime, tmp_path, "a.txt", TEXT))
    assert (job.status, job.error_category, job.error_code) == (
        "failed",
        "user_action_required",
        "embedder_auth",
    )
    assert job.retryable
    assert SECRET not in (job.error or "")
    key_file.write_text("sk-the-new-key\n")  # the operator fixes the key: no restart
    retried = openai_runtime.service.jobs.retry("default", job.id)
    assert _finished(openai_runtime, retried.id).status == "completed"


def test_a_search_while_the_provider_is_down_is_503_not_a_crash(
    openai_runtime: EmbeddedRole, provider: Provider
) -> None:
    provider.control(mode="error500")
    dataset = openai_runtime.service.datasets.ensure_default("default").id
    with pytest.raises(ServiceUnavailable) as caught:
        openai_runtime.service.search.search(
            "default", dataset, "anything", top_k=3, mode=SearchMode.VECTOR
        )
    assert "keyword search still works" in caught.value.message
    assert (
        openai_runtime.service.search.search(
            "default", dataset, "anything", top_k=3, mode=SearchMode.KEYWORD
        )
        == []
    )


def test_retry_after_as_an_http_date_and_408(provider: Provider, key_file: Path) -> None:

    assert _retry_after("Wed, 21 Oct 2015 07:28:00 -0000") == 0.0  # in the past, naive: UTC
    assert _retry_after("12") == 12.0
    assert _retry_after("soon") is None


def test_an_empty_key_file_needs_the_user(provider: Provider, tmp_path: Path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(UserActionRequired) as caught:
        make(provider, empty).embed(["a"])
    assert caught.value.code == "embedder_key_missing"


def test_a_search_does_not_queue_behind_ingestion_for_a_provider_slot(
    openai_runtime: EmbeddedRole,
) -> None:
    """Every slot of the shared limit is taken (as by busy workers): a vector search answers 503
    after about one request's timeout instead of waiting for ingestion to finish."""
    default = openai_runtime.service.datasets.ensure_default("default")
    search = openai_runtime.service.search
    limit = search.models.for_queries(default.embedding_model).limit  # type: ignore[attr-defined]
    dataset = default.id
    with contextlib.ExitStack() as held:
        for _ in range(limit.size):
            held.enter_context(limit.slot())
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable) as caught:
            openai_runtime.service.search.search(
                "default", dataset, "kettle", top_k=3, mode=SearchMode.VECTOR
            )
        assert caught.value.code == "search_embedder_busy"
        assert time.monotonic() - started < 10  # the fixture's timeout is 2 s
