"""The events webhooks deliver, written where the change they report is written: the jobs
core tells `WebhookEvents` of each job that ended, inside that transaction, and it adds one
delivery per matching webhook (its body fixed now, so every attempt sends the same bytes) and a
job of kind `webhook` with its outbox row. Nothing is sent here: a slow receiver can never
hold up the job that ended."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select

from knowledgeops.db.engine import Tx
from knowledgeops.db.schema import datasets, documents, webhook_deliveries, webhooks
from knowledgeops.jobs.model import Job, NewJob
from knowledgeops.jobs.store import JobStore
from knowledgeops.webhooks import EVENTS, WEBHOOK_KIND


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat().replace("+00:00", "Z")


def event_body(event_id: str, event: str, job: Job, file_name: str | None, now: datetime) -> str:
    """The JSON a receiver gets: the event's id (to dedupe on), type, time and the job as it
    ended, in the API's camelCase."""
    data: dict[str, Any] = {
        "id": job.id,
        "kind": job.kind,
        "status": job.status.value,
        "stage": job.stage.value,
        "datasetId": job.dataset_id,
        "documentId": job.document_id,
        "fileName": file_name,
        "totalChunks": job.total_chunks,
        "processedChunks": job.processed_chunks,
        "attempt": job.attempt,
        "maxAttempts": job.max_attempts,
        "error": job.error,
        "errorCode": job.error_code,
        "errorCategory": job.error_category,
        "retryable": job.retryable,
        "startedAt": _iso(job.started_at),
        "finishedAt": _iso(job.finished_at),
    }
    body = {"id": event_id, "type": event, "createdAt": _iso(now), "data": {"job": data}}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class WebhookEvents:
    """The outcome listener (jobs.store.OutcomeListener) that turns a job's end into
    deliveries."""

    max_attempts: int

    def on_outcome(self, store: JobStore, tx: Tx, job: Job, now: datetime) -> None:
        if job.kind == WEBHOOK_KIND:  # a delivery's own end is no event
            return
        event = f"job.{job.status.value}"
        if event not in EVENTS:
            return
        tenant = tx.scalar(select(datasets.c.tenant_id).where(datasets.c.id == job.dataset_id))
        if tenant is None:
            return
        subscribed = tx.execute(
            select(webhooks.c.id, webhooks.c.events)
            .where(
                webhooks.c.tenant_id == tenant,
                or_(webhooks.c.dataset_id.is_(None), webhooks.c.dataset_id == job.dataset_id),
            )
            # PostgreSQL: a webhook deleted meanwhile must not fail the deliveries' foreign key
            # (and with it the job's end); the delete waits for this transaction instead
            .with_for_update(read=True, key_share=True)
        ).all()
        chosen = [row.id for row in subscribed if event in row.events]
        if not chosen:
            return
        file_name = None
        if job.document_id is not None:
            file_name = tx.scalar(
                select(documents.c.file_name).where(documents.c.id == job.document_id)
            )
        for webhook_id in sorted(chosen):
            event_id, delivery_job = str(uuid.uuid4()), str(uuid.uuid4())
            tx.execute(
                insert(webhook_deliveries).values(
                    id=event_id,
                    webhook_id=webhook_id,
                    job_id=delivery_job,
                    subject_job_id=job.id,
                    event=event,
                    body=event_body(event_id, event, job, file_name, now),
                    created_at=now,
                )
            )
            new = NewJob(
                id=delivery_job,
                document_id=None,
                dataset_id=job.dataset_id,
                generation=0,
                max_attempts=self.max_attempts,
                kind=WEBHOOK_KIND,
            )
            store.add(new, now=now, tx=tx)
