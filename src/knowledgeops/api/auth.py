"""Who is calling: `Authorization: Bearer <API key>` → the tenant every use case is scoped to,
then the key's request rate.

With `KOPS_AUTH=off` every request acts for the default tenant (the start-up log warns). The
rate limit counts per key (per client address when auth is off) in memory, or in Redis when
`KOPS_CACHE_URL` is set, so that all API processes share one count.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from limits import RateLimitItem, parse
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from knowledgeops.errors import TooManyRequests, Unauthorized
from knowledgeops.service.keys import Principal
from knowledgeops.service.knowledge_base import Admission, KnowledgeBase
from knowledgeops.settings import DEFAULT_TENANT

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `kops keys create` (the first one is printed at first start).",
)

MISSING = (
    "this endpoint needs an API key: send `Authorization: Bearer <key>` (create one with "
    "`kops keys create`)"
)
INVALID = "the API key is not valid: it is unknown or was revoked"


class RateLimiter:
    """N requests per window per caller, over a moving window; fails open (with a warning) when
    its Redis cannot be reached: a cache outage must not lock every tenant out."""

    def __init__(self, rate: str, storage_url: str | None = None) -> None:
        self.item: RateLimitItem = parse(rate)
        storage = (
            storage_from_string(storage_url, socket_timeout=1.0, socket_connect_timeout=1.0)
            if storage_url
            else MemoryStorage()
        )
        assert isinstance(storage, Storage)  # the synchronous kind
        self.limiter = MovingWindowRateLimiter(storage)
        self._warned_at = 0.0

    def check(self, caller: str) -> None:
        try:
            allowed = self.limiter.hit(self.item, "kops-api", caller)
            if allowed:
                return
            stats = self.limiter.get_window_stats(self.item, "kops-api", caller)
        except Exception as exc:  # the limiter's Redis is down: let the request through
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning("rate limit not enforced: its store failed (%s)", type(exc).__name__)
            return
        wait = max(1, math.ceil(stats.reset_time - time.time()))
        raise TooManyRequests(
            f"too many requests for this API key (the limit is {self.item}); try again in {wait} s",
            code="rate_limited",
            retry_after_s=wait,
        )


def rate_limiter_for(admission: Admission) -> RateLimiter:
    return RateLimiter(admission.rate_limit, admission.rate_limit_url)


def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    service: KnowledgeBase = request.app.state.service
    limiter: RateLimiter = request.app.state.rate_limiter
    if not service.admission.auth:
        limiter.check(f"addr:{request.client.host if request.client else '-'}")
        return Principal(DEFAULT_TENANT, None)
    address = f"addr:{request.client.host if request.client else '-'}"
    if credentials is None:
        raise Unauthorized(MISSING, code="unauthorized")
    found = service.keys.authenticate(credentials.credentials)
    if found is None:
        limiter.check(address)  # guessing keys from one address meets the limit too
        raise Unauthorized(INVALID, code="invalid_api_key")
    limiter.check(f"key:{found.key_id}")
    return found


def tenant_of(principal: Annotated[Principal, Depends(authenticate)]) -> str:
    return principal.tenant_id


Tenant = Annotated[str, Depends(tenant_of)]
