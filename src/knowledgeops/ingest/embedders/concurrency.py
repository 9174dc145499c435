"""One limit on concurrent provider requests, shared by every worker (docs/architecture.md:
Embedding and search).

`LocalLimit` is a semaphore for the threads of one process (the embedded default).
`RedisLimit` is a semaphore in Redis for every process on every machine: each holder is a member
of a sorted set scored by its lease's end (Redis' own clock), taken and counted in one Lua script,
so a crashed holder's slot comes back when its lease runs out. When Redis does not answer, each
process falls back to a single slot of its own (and says so): the total then depends on how many
processes run, but stays as low as it can without stopping work during a Redis outage.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import redis

from knowledgeops.errors import TransientError

log = logging.getLogger(__name__)

POLL_S = 0.02  # s: how often a waiting holder asks again

# KEYS[1]: the set; ARGV: lease seconds, limit, token. Returns 1 when the slot was taken.
_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], t + tonumber(ARGV[1]), ARGV[3])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 60)
  return 1
end
return 0
"""


class ConcurrencyLimit(Protocol):
    def slot(self, wait_s: float | None = None) -> AbstractContextManager[None]:
        """Hold one of the limit's slots for the duration of the block; wait at most `wait_s`
        (default: the limit's own) for one to come free, else TransientError(embedder_busy)."""
        ...


class LocalLimit:
    def __init__(self, size: int, *, wait_s: float = 600.0) -> None:
        self.size = size
        self.wait_s = wait_s
        self._semaphore = threading.BoundedSemaphore(size)

    @contextmanager
    def slot(self, wait_s: float | None = None) -> Iterator[None]:
        wait = self.wait_s if wait_s is None else wait_s
        if not self._semaphore.acquire(timeout=wait):
            raise TransientError(
                f"no embedding slot came free within {wait:g} s", code="embedder_busy"
            )
        try:
            yield
        finally:
            self._semaphore.release()


class RedisLimit:
    def __init__(
        self,
        url: str,
        size: int,
        *,
        name: str = "kops:limit:embedder",
        lease_s: float = 120.0,
        wait_s: float = 600.0,
    ) -> None:

        self.size = size
        self.key = name
        self.lease_s = lease_s
        self.wait_s = wait_s
        self._redis: Any = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._fallback = LocalLimit(1, wait_s=wait_s)
        self._errors = redis.RedisError

    @contextmanager
    def slot(self, wait_s: float | None = None) -> Iterator[None]:
        token = uuid.uuid4().hex
        try:
            self._take(token, self.wait_s if wait_s is None else wait_s)
        except self._errors as exc:
            log.warning("the shared embedding limit is unavailable (%s); limiting locally", exc)
            with self._fallback.slot(wait_s):
                yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(self._errors):  # else the lease runs out by itself
                self._redis.zrem(self.key, token)

    def _take(self, token: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while not self._acquire(keys=[self.key], args=[self.lease_s, self.size, token]):
            if time.monotonic() > deadline:
                raise TransientError(
                    f"no embedding slot came free within {wait_s:g} s", code="embedder_busy"
                )
            time.sleep(POLL_S)

    def holders(self) -> int:
        return int(self._redis.zcard(self.key))
