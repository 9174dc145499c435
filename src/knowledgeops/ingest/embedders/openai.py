"""An OpenAI-compatible HTTP embedder (`KOPS_EMBEDDER=openai`): POST {base}/embeddings.

Every answer is classified (docs/architecture.md: Failure classes): timeouts, connection errors,
429 (with its Retry-After) and 5xx are transient; 401/403 need the user to fix the key; 400 and
other 4xx mean this input cannot be embedded (permanent). The key comes from a setting or a file;
the file is read again when it changes (so new jobs use a rotated key without a restart) and once
more after a 401 before the job is failed. No key ever appears in a message, a log line or a job
row.

One concurrency limit is shared by every worker: a semaphore in this process, or in Redis in
the scale-out topology (see `concurrency.py`).
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from knowledgeops.ingest.embedders.base import Embedder, Vectors
from knowledgeops.ingest.embedders.concurrency import ConcurrencyLimit

log = logging.getLogger(__name__)

MAX_ERROR_TEXT = 300  # characters of the provider's own message kept in a job error
EMPTY_KEY_RETRY_S = 0.2  # s: an empty key file is read once more after this


class KeySource:
    """The provider key, from a fixed secret or from a file that may be rotated at any time."""

    def __init__(self, key: str | None = None, key_file: Path | None = None) -> None:
        if key is None and key_file is None:
            raise ValueError("an API key or a key file is needed")
        self._key = key
        self._file = key_file
        self._seen: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        """The key now: the file is read again whenever it changed."""
        if self._file is None:
            assert self._key is not None
            return self._key
        with self._lock:
            try:
                stat = self._file.stat()
            except OSError:
                raise self._missing() from None
            seen = (stat.st_mtime, stat.st_size)
            if self._key is None or seen != self._seen:
                self._key = self._read()
                self._seen = seen
            return self._key

    def reload(self) -> str:
        """Read the file again whatever its timestamps say (after the provider refused the key)."""
        if self._file is None:
            return self.current()
        with self._lock:
            self._key = self._read()
            return self._key

    def _read(self) -> str:
        assert self._file is not None
        try:
            key = self._file.read_text(encoding="utf-8").strip()
            if not key:  # perhaps caught half-way through a rewrite: look once more
                time.sleep(EMPTY_KEY_RETRY_S)
                key = self._file.read_text(encoding="utf-8").strip()
        except OSError:
            raise self._missing() from None
        if not key:
            raise UserActionRequired(
                "the embedding provider's key file is empty; put the key in "
                "KOPS_OPENAI_API_KEY_FILE and retry the job",
                code="embedder_key_missing",
            )
        return key

    def _missing(self) -> UserActionRequired:
        return UserActionRequired(
            "the embedding provider's key file (KOPS_OPENAI_API_KEY_FILE) cannot be read; "
            "create it and retry the job",
            code="embedder_key_missing",
        )


class OpenAIEmbedder(Embedder):
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimension: int,
        keys: KeySource,
        limit: ConcurrencyLimit,
        timeout_s: float = 30.0,
        slot_wait_s: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.model_id = f"openai:{model}"
        self.dimension = dimension
        self.keys = keys
        self.limit = limit
        self.timeout_s = timeout_s
        self.slot_wait_s = slot_wait_s
        self._client = _http_client(timeout_s)
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        key = self.keys.current()
        response = self._post(texts, key)
        if response.status_code in (401, 403):
            fresh = self.keys.reload()  # the key may have been rotated since it was read
            if fresh != key:
                log.info("embedding provider refused the key; retrying with the key file's new key")
                response = self._post(texts, fresh)
        return self._vectors(response, len(texts))

    def _post(self, texts: Sequence[str], key: str) -> httpx.Response:
        with self.limit.slot(self.slot_wait_s):
            try:
                response = self._client.post(
                    f"{self.base_url}/embeddings",
                    json={"model": self.model, "input": list(texts)},
                    headers={"Authorization": f"Bearer {key}"},
                )
            except httpx.TimeoutException:
                raise TransientError(
                    f"the embedding provider did not answer within {self.timeout_s:g} s",
                    code="embedder_timeout",
                ) from None
            except httpx.TransportError as exc:
                raise TransientError(
                    f"the embedding provider could not be reached ({type(exc).__name__})",
                    code="embedder_unreachable",
                ) from None
        self.calls += 1
        return response

    def _vectors(self, response: httpx.Response, count: int) -> Vectors:
        status = response.status_code
        if status in (408, 429):
            raise TransientError(
                f"the embedding provider is rate limiting ({status})"
                if status == 429
                else "the embedding provider timed out (408)",
                code="rate_limited" if status == 429 else "embedder_timeout",
                retry_after_s=_retry_after(response.headers.get("retry-after")),
            )
        if status >= 500:
            raise TransientError(f"the embedding provider failed ({status})", code="embedder_error")
        if status in (401, 403):
            raise UserActionRequired(
                f"the embedding provider refused the API key ({status}); put a valid key in "
                "KOPS_OPENAI_API_KEY_FILE (or KOPS_OPENAI_API_KEY) and retry the job",
                code="embedder_auth",
            )
        if status >= 400:
            raise PermanentError(
                f"the embedding provider cannot embed this text ({status}: "
                f"{_provider_message(response)})",
                code="embedder_rejected",
            )
        return self._parse(response, count)

    def _parse(self, response: httpx.Response, count: int) -> Vectors:
        try:
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = np.asarray([item["embedding"] for item in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError):
            raise TransientError(
                "the embedding provider sent an answer that is not an embeddings list",
                code="embedder_bad_response",
            ) from None
        if vectors.shape != (count, self.dimension):
            raise PermanentError(
                f"the embedding provider returned vectors of shape {vectors.shape} for {count} "
                f"texts; KOPS_OPENAI_DIMENSIONS is {self.dimension}",
                code="embedder_dimension",
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.asarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)

    def for_queries(self) -> OpenAIEmbedder:
        """The same provider, key and limit, for search queries: a query waits for a slot at
        most as long as one request may take (a search should fail fast, not queue behind
        ingestion)."""
        queries = copy.copy(self)
        queries.slot_wait_s = self.timeout_s
        queries._client = _http_client(self.timeout_s)  # connections of its own
        queries.calls = 0
        return queries

    def close(self) -> None:
        self._client.close()


def _http_client(timeout_s: float) -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)))


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None

    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _provider_message(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    text = str(message or response.text or "no message")
    return " ".join(text.split())[:MAX_ERROR_TEXT]
