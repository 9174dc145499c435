"""Webhook signatures: what the server signs each delivery with and how a receiver checks it.

A delivery carries `Kops-Signature: t=<unix seconds>,v1=<hex>` where the hex is
HMAC-SHA256(secret, f"{t}.{body}") over the raw request body, and the secret is the one
`POST /webhooks` showed once. A receiver recomputes it, compares in constant time, and refuses
a timestamp older than its tolerance (a replayed request), then dedupes on `Kops-Event-Id`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

from knowledgeops.errors import ClientError

SIGNATURE_HEADER = "Kops-Signature"
EVENT_ID_HEADER = "Kops-Event-Id"
EVENT_TYPE_HEADER = "Kops-Event-Type"
TOLERANCE_S = 300.0


class SignatureInvalid(ClientError):
    """The delivery was not signed with this secret, or is too old to trust."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="signature_invalid")


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The `Kops-Signature` header value for `body` sent at `timestamp`."""
    signed = str(timestamp).encode() + b"." + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify_signature(
    secret: str,
    body: bytes,
    header: str | Mapping[str, str],
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> int:
    """Check a delivery: `header` is the Kops-Signature value or the request's headers. Returns
    the signed timestamp; raises SignatureInvalid."""
    if not isinstance(header, str):
        lowered = {k.lower(): v for k, v in header.items()}
        found = lowered.get(SIGNATURE_HEADER.lower())
        if found is None:
            raise SignatureInvalid(f"no {SIGNATURE_HEADER} header")
        header = found
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        raise SignatureInvalid(f"{SIGNATURE_HEADER} has no timestamp") from None
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    given = [v for k, v in (p.split("=", 1) for p in header.split(",") if "=" in p) if k == "v1"]
    wanted = expected.encode()
    if not any(hmac.compare_digest(wanted, candidate.encode()) for candidate in given):
        raise SignatureInvalid("the signature does not match this secret and body")
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance_s:
        raise SignatureInvalid(
            f"the delivery was signed {age:.0f} s ago (tolerance {tolerance_s:g} s)"
        )
    return timestamp
