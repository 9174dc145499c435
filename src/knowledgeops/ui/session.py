"""Who is using the dashboard: sign-in with an API key, kept in an HttpOnly, SameSite=Strict
cookie scoped to /ui (never in a URL or a page); a CSRF token on every form and every htmx
request (an HMAC of the key, so every API process derives the same one); and the Origin of every
POST checked against the host."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from knowledgeops.api.auth import RateLimiter
from knowledgeops.errors import Forbidden, Unauthorized
from knowledgeops.service.keys import Principal
from knowledgeops.service.knowledge_base import KnowledgeBase
from knowledgeops.settings import DEFAULT_TENANT

COOKIE = "kops_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
MAX_AGE_S = 12 * 3600  # s: a sign-in lasts a working day
_OPEN_SECRET = secrets.token_bytes(32)  # KOPS_AUTH=off: no key to derive tokens from


class SignInRequired(Unauthorized):
    """No key, or one unknown or revoked: the page sends the browser to the sign-in form."""

    code = "sign_in_required"


@dataclass(frozen=True, slots=True)
class User:
    principal: Principal
    csrf: str

    @property
    def tenant(self) -> str:
        return self.principal.tenant_id


def csrf_for(key: str | None) -> str:
    secret = key.encode() if key else _OPEN_SECRET
    return hmac.new(secret, b"kops-dashboard-csrf", hashlib.sha256).hexdigest()


def set_session(response: object, key: str, *, secure: bool) -> None:
    response.set_cookie(  # type: ignore[attr-defined]
        COOKIE,
        key,
        max_age=MAX_AGE_S,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def clear_session(response: object) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")  # type: ignore[attr-defined]


def signed_in(request: Request) -> User:
    """The dashboard's user, from the session cookie (SignInRequired without a valid one)."""
    service: KnowledgeBase = request.app.state.service
    limiter: RateLimiter = request.app.state.rate_limiter
    if not service.admission.auth:
        return User(Principal(DEFAULT_TENANT, None), csrf_for(None))
    key = request.cookies.get(COOKIE)
    if not key:
        raise SignInRequired("sign in with an API key")
    found = service.keys.authenticate(key)
    if found is None:
        limiter.check(f"addr:{request.client.host if request.client else '-'}")
        raise SignInRequired("the API key of this session is unknown or was revoked")
    limiter.check(f"key:{found.key_id}")
    return User(found, csrf_for(key))


UserDep = Annotated[User, Depends(signed_in)]


def same_origin(request: Request) -> None:
    """A POST must come from a page of this server (Origin, else Referer, names this host)."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return  # not a browser (a browser sends Origin on every POST; the CSRF token still holds)
    host = request.headers.get("host", "")
    if source.split("://", 1)[-1].split("/", 1)[0] != host:
        raise Forbidden("this form was sent from another site")


def check_csrf(request: Request, user: User, form_token: str | None = None) -> None:
    same_origin(request)
    token = request.headers.get(CSRF_HEADER) or form_token or ""
    if not hmac.compare_digest(token, user.csrf):
        raise Forbidden("the form's security token is missing or stale: reload the page")
