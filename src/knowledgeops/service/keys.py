"""API keys: create (the secret is shown once), list, revoke, and find the tenant of a key.

A key is `kops_` + 43 URL-safe characters (256 random bits). Only its sha256 is stored: a key
that random cannot be recovered from its hash, so no slow password hash is needed, and a lookup
is one indexed read. Revoking takes effect at the next request.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, or_, select, update

from knowledgeops.clock import utcnow
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import api_keys
from knowledgeops.errors import InvalidRequest, NotFound
from knowledgeops.settings import DEFAULT_TENANT

KEY_PREFIX = "kops_"
SHOWN_PREFIX = 12  # characters of a key kept in the clear, to tell keys apart in listings
TENANT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_KEY_SHAPE = re.compile(r"^kops_[A-Za-z0-9_-]{20,100}$")


@dataclass(frozen=True, slots=True)
class ApiKeyView:
    id: str
    tenant_id: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant whose data every query is scoped to, and by which key."""

    tenant_id: str
    key_id: str | None


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not TENANT_PATTERN.match(tenant):
        raise InvalidRequest(
            "a tenant is 1 to 64 characters: lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit",
            code="invalid_tenant",
        )
    return tenant


def _view(row: object) -> ApiKeyView:
    m = row._mapping  # type: ignore[attr-defined]
    return ApiKeyView(
        m["id"], m["tenant_id"], m["name"], m["prefix"], m["created_at"], m["revoked_at"]
    )


class ApiKeys:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, tenant: str, name: str) -> tuple[ApiKeyView, str]:
        """A new key for `tenant`; returns it with its secret, which is not stored."""
        check_tenant(tenant)
        name = " ".join(name.split())
        if not 1 <= len(name) <= 200:
            raise InvalidRequest("a key's name is 1 to 200 characters", code="invalid_name")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = str(uuid.uuid4())
        with self.db.write() as conn:
            conn.execute(
                insert(api_keys).values(
                    id=key_id,
                    tenant_id=tenant,
                    name=name,
                    prefix=secret[:SHOWN_PREFIX],
                    key_hash=hash_key(secret),
                    created_at=utcnow(),
                )
            )
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).one()
        return _view(row), secret

    def list(self, tenant: str | None = None, *, include_revoked: bool = False) -> list[ApiKeyView]:
        query = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
        if tenant is not None:
            query = query.where(api_keys.c.tenant_id == tenant)
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        with self.db.read() as conn:
            return [_view(row) for row in conn.execute(query)]

    def revoke(self, key: str) -> ApiKeyView:
        """Revoke by id or by the shown prefix (which must match exactly one key)."""
        with self.db.write() as conn:
            rows = conn.execute(
                select(api_keys).where(or_(api_keys.c.id == key, api_keys.c.prefix == key))
            ).all()
            if not rows:
                raise NotFound("no API key has this id or prefix", code="key_not_found")
            if len(rows) > 1:
                raise InvalidRequest(
                    "several keys share this prefix; revoke by id", code="ambiguous_key"
                )
            found = _view(rows[0])
            if found.revoked_at is None:
                conn.execute(
                    update(api_keys).where(api_keys.c.id == found.id).values(revoked_at=utcnow())
                )
            return _view(conn.execute(select(api_keys).where(api_keys.c.id == found.id)).one())

    def authenticate(self, secret: str) -> Principal | None:
        """The tenant of an active key; None for anything else (unknown, revoked, malformed)."""
        if not _KEY_SHAPE.match(secret):
            return None
        with self.db.read() as conn:
            row = conn.execute(
                select(api_keys.c.id, api_keys.c.tenant_id).where(
                    api_keys.c.key_hash == hash_key(secret), api_keys.c.revoked_at.is_(None)
                )
            ).first()
        return None if row is None else Principal(row.tenant_id, row.id)

    def count_active(self) -> int:
        with self.db.read() as conn:
            found = conn.scalar(
                select(func.count()).select_from(api_keys).where(api_keys.c.revoked_at.is_(None))
            )
        return int(found or 0)

    def ensure_first_key(self) -> str | None:
        """On a database without any key (revoked ones included), create one for the default
        tenant and return its secret; None when keys exist already."""
        with self.db.read() as conn:
            any_key = conn.scalar(select(func.count()).select_from(api_keys))
        if any_key:
            return None
        _, secret = self.create(DEFAULT_TENANT, "first key (created at first start)")
        return secret
