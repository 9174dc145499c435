"""Webhooks as users manage them: make one (its URL checked, its secret shown once), list, read,
delete, and see each one's deliveries with their attempts, or send a failed one again. Scoped by
tenant: another tenant's webhook is "not found" (docs/architecture.md: Webhooks)."""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update

from knowledgeops.clock import utcnow
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import datasets, ingest_jobs, webhook_attempts, webhook_deliveries
from knowledgeops.db.schema import webhooks as W
from knowledgeops.errors import Conflict, InvalidField, InvalidTransition, JobStateError, NotFound
from knowledgeops.jobs.model import NewJob
from knowledgeops.jobs.states import OPEN, JobStatus
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.views import Page
from knowledgeops.webhooks import EVENTS, WEBHOOK_KIND, guard

MAX_WEBHOOKS = 50  # per tenant: each job's end is looked up against them all
SHOWN_ATTEMPTS = 5  # the latest attempts listed with a delivery
SECRET_PREFIX = "whsec_"


@dataclass(frozen=True, slots=True)
class WebhookView:
    id: str
    url: str
    events: list[str]
    dataset_id: str | None
    description: str
    secret_hint: str
    created_at: datetime
    secret: str | None = None  # only in the answer that made it


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True, slots=True)
class DeliveryView:
    id: str
    event: str
    subject_job_id: str
    status: str
    attempts: list[AttemptView]
    created_at: datetime
    delivered_at: datetime | None


def _hint(secret: str) -> str:
    return secret[: len(SECRET_PREFIX) + 4] + "…"


@dataclass(eq=False)
class Webhooks:
    db: Database
    store: JobStore
    _: KW_ONLY
    allow_private: bool  # KOPS_WEBHOOK_ALLOW_PRIVATE
    max_attempts: int  # what a delivery sent again may use
    notify: Callable[[], None]  # after a transaction wrote an outbox row

    def create(
        self,
        tenant: str,
        url: str,
        events: Sequence[str],
        *,
        dataset_id: str | None,
        description: str,
    ) -> WebhookView:
        """A new webhook. Its URL must be callable now (a public address unless private ones
        are allowed: 422 otherwise); its secret is in this answer only."""
        unknown = sorted(set(events) - set(EVENTS))
        if unknown:
            raise InvalidField(
                f"unknown events {unknown}; one of {list(EVENTS)}", code="invalid_event"
            )
        try:
            guard.resolve(url, allow_private=self.allow_private)
        except guard.UrlRefused as exc:
            raise InvalidField(f"url: {exc}", code="webhook_url_refused") from None
        except OSError as exc:
            raise InvalidField(
                f"url: the host does not resolve: {exc}", code="webhook_url_unresolved"
            ) from None
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        webhook_id = str(uuid.uuid4())
        now = utcnow()
        with self.db.write() as conn:
            if (
                dataset_id is not None
                and conn.scalar(
                    select(datasets.c.id).where(
                        datasets.c.id == dataset_id, datasets.c.tenant_id == tenant
                    )
                )
                is None
            ):
                raise NotFound("dataset not found", code="dataset_not_found")
            count = conn.scalar(select(func.count()).select_from(W).where(W.c.tenant_id == tenant))
            if (count or 0) >= MAX_WEBHOOKS:
                raise Conflict(
                    f"a tenant may have {MAX_WEBHOOKS} webhooks; delete one first",
                    code="too_many_webhooks",
                )
            conn.execute(
                insert(W).values(
                    id=webhook_id,
                    tenant_id=tenant,
                    url=url.strip(),
                    events=list(dict.fromkeys(events)),
                    dataset_id=dataset_id,
                    description=description,
                    secret=secret,
                    created_at=now,
                )
            )
        return replace(self.get(tenant, webhook_id), secret=secret)

    def list(self, tenant: str, *, page: int, limit: int) -> Page[WebhookView]:
        with self.db.read() as conn:
            total = conn.scalar(select(func.count()).select_from(W).where(W.c.tenant_id == tenant))
            rows = conn.execute(
                select(W)
                .where(W.c.tenant_id == tenant)
                .order_by(W.c.created_at, W.c.id)
                .offset((page - 1) * limit)
                .limit(limit)
            ).all()
        return Page([_view(r) for r in rows], total or 0, page, limit)

    def get(self, tenant: str, webhook_id: str) -> WebhookView:
        with self.db.read() as conn:
            row = conn.execute(
                select(W).where(W.c.id == webhook_id, W.c.tenant_id == tenant)
            ).first()
        if row is None:
            raise NotFound("webhook not found", code="webhook_not_found")
        return _view(row)

    def delete(self, tenant: str, webhook_id: str) -> None:
        """Delete the webhook and its deliveries; those still on their way are cancelled."""
        with self.db.write() as conn:
            if (
                conn.scalar(select(W.c.id).where(W.c.id == webhook_id, W.c.tenant_id == tenant))
                is None
            ):
                raise NotFound("webhook not found", code="webhook_not_found")
            open_jobs = conn.scalars(
                select(ingest_jobs.c.id)
                .join(webhook_deliveries, webhook_deliveries.c.job_id == ingest_jobs.c.id)
                .where(
                    webhook_deliveries.c.webhook_id == webhook_id,
                    ingest_jobs.c.status.in_([s.value for s in OPEN]),
                )
            ).all()
            conn.execute(W.delete().where(W.c.id == webhook_id))
        for job_id in open_jobs:  # the handler would find nothing to send; stop it sooner
            with contextlib.suppress(JobStateError):  # it ended meanwhile
                self.store.cancel(job_id, now=utcnow())

    def deliveries(
        self, tenant: str, webhook_id: str, *, page: int, limit: int, event_id: str | None = None
    ) -> Page[DeliveryView]:
        """The webhook's deliveries (or the one of `event_id`), newest first, each with its
        latest attempts."""
        self.get(tenant, webhook_id)
        D = webhook_deliveries
        scope = [D.c.webhook_id == webhook_id]
        if event_id is not None:
            scope.append(D.c.id == event_id)
        with self.db.read() as conn:
            total = conn.scalar(select(func.count()).select_from(D).where(*scope))
            rows = conn.execute(
                select(
                    D.c.id,
                    D.c.event,
                    D.c.subject_job_id,
                    D.c.created_at,
                    D.c.delivered_at,
                    ingest_jobs.c.status,
                )
                .outerjoin(ingest_jobs, ingest_jobs.c.id == D.c.job_id)
                .where(*scope)
                .order_by(D.c.created_at.desc(), D.c.id)
                .offset((page - 1) * limit)
                .limit(limit)
            ).all()
            attempts: dict[str, list[AttemptView]] = defaultdict(list)
            if rows:
                A = webhook_attempts
                for a in conn.execute(
                    select(A)
                    .where(A.c.delivery_id.in_([r.id for r in rows]))
                    .order_by(A.c.id.desc())
                ):
                    if len(attempts[a.delivery_id]) < SHOWN_ATTEMPTS:
                        attempts[a.delivery_id].append(
                            AttemptView(a.attempt, a.at, a.status_code, a.error, a.duration_ms)
                        )
        items = [
            DeliveryView(
                id=r.id,
                event=r.event,
                subject_job_id=r.subject_job_id,
                status=r.status or JobStatus.CANCELLED.value,  # its job went with its dataset
                attempts=attempts.get(r.id, []),
                created_at=r.created_at,
                delivered_at=r.delivered_at,
            )
            for r in rows
        ]
        return Page(items, total or 0, page, limit)

    def redeliver(self, tenant: str, webhook_id: str, event_id: str) -> DeliveryView:
        """Send a delivery that failed (or was cancelled) again, with the same event id and
        body; 409 if it was delivered or is still on its way."""
        self.get(tenant, webhook_id)
        with self.db.read() as conn:
            row = conn.execute(
                select(webhook_deliveries.c.job_id, webhook_deliveries.c.delivered_at).where(
                    webhook_deliveries.c.id == event_id,
                    webhook_deliveries.c.webhook_id == webhook_id,
                )
            ).first()
        if row is None:
            raise NotFound("delivery not found", code="delivery_not_found")
        if row.delivered_at is not None:
            raise Conflict(f"delivered at {row.delivered_at.isoformat()}", code="already_delivered")
        if self.store.get(row.job_id) is None:  # its job is gone: a new one carries it
            self._new_job(event_id)
        else:
            try:
                self.store.requeue(row.job_id, now=utcnow(), extra_attempts=self.max_attempts)
            except InvalidTransition:
                raise Conflict(
                    "this delivery is still on its way", code="delivery_in_progress"
                ) from None
        self.notify()
        (again,) = self.deliveries(tenant, webhook_id, page=1, limit=1, event_id=event_id).items
        return again

    def _new_job(self, event_id: str) -> None:
        job_id = str(uuid.uuid4())
        with self.db.write() as conn:
            # the dataset of the job the event is about, where it is still there (a delivery's
            # job is no dataset's business: it only has to name one)
            dataset_id = conn.scalar(
                select(ingest_jobs.c.dataset_id)
                .join(webhook_deliveries, webhook_deliveries.c.subject_job_id == ingest_jobs.c.id)
                .where(webhook_deliveries.c.id == event_id)
            )
            conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.id == event_id)
                .values(job_id=job_id)
            )
            new = NewJob(job_id, None, dataset_id or "", 0, self.max_attempts, kind=WEBHOOK_KIND)
            self.store.add(new, now=utcnow(), tx=conn)


def _view(row: Any) -> WebhookView:
    """A row of the webhooks table, its secret reduced to a hint."""
    return WebhookView(
        id=row.id,
        url=row.url,
        events=list(row.events),
        dataset_id=row.dataset_id,
        description=row.description,
        secret_hint=_hint(row.secret),
        created_at=row.created_at,
    )
