"""`JobStore` on SQLAlchemy Core: the same statements on SQLite and PostgreSQL.

The rules are `JobStore`'s (store.py); this supplies its primitives: every status change is one
`UPDATE … WHERE status = :seen AND version = :seen_version` (a worker's also fenced by
`lease_owner` and `attempt`), and on PostgreSQL rows are locked parent before part and a rescue
skips a row another session holds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import Row, and_, delete, exists, func, insert, or_, select, update

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import ingest_jobs as J
from knowledgeops.db.schema import job_events as E
from knowledgeops.db.schema import outbox as O
from knowledgeops.jobs.model import Change, Job, JobMetrics, Lease, OutboxItem
from knowledgeops.jobs.parts import Summed
from knowledgeops.jobs.records import CHANGE, OUTCOMES, age, change_of
from knowledgeops.jobs.rows import Fence, Values
from knowledgeops.jobs.states import OPEN, JobStatus, Stage
from knowledgeops.jobs.store import JobStore, OutcomeListener, TransitionListener

_OPEN = [status.value for status in OPEN]
P = J.alias("part")
# a running job that split and waits on parts still at work: no worker holds it, none is lost
_WAITING_ON_PARTS = exists().where(P.c.parent_id == J.c.id, P.c.status.in_(_OPEN))
PUBLISH_HOLD_LIMIT_S = 60  # s: PostgreSQL ends a publishing relay's transaction idle this long


def _job(row: Row[Any]) -> Job:
    values = row._asdict()
    values.pop("stage_started_at", None)
    values["status"] = JobStatus(values["status"])
    values["stage"] = Stage(values["stage"])
    return Job(**values)


def _plain(values: Values) -> dict[str, Any]:
    """Column values as the database takes them (an enum's value)."""
    return {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}


def _silent(stale_before: datetime) -> Any:
    return and_(
        or_(J.c.heartbeat_at.is_(None), J.c.heartbeat_at < stale_before), ~_WAITING_ON_PARTS
    )


class SqlJobStore(JobStore):
    def __init__(
        self,
        db: Database,
        listener: TransitionListener | None = None,
        outcomes: Sequence[OutcomeListener] = (),
        silent_kinds: Collection[str] = (),
    ) -> None:
        super().__init__(listener, outcomes, silent_kinds)
        self.db = db

    # --- primitives -----------------------------------------------------------------------------
    def _write(self) -> AbstractContextManager[Tx]:
        return self.db.write()

    def _read(self) -> AbstractContextManager[Tx]:
        return self.db.read()

    def _load(self, tx: Tx, job_id: str) -> Job | None:
        row = tx.execute(select(J).where(J.c.id == job_id)).first()
        return None if row is None else _job(row)

    def _load_by_key(self, tx: Tx, key: str) -> Job | None:
        row = tx.execute(select(J).where(J.c.idempotency_key == key)).first()
        return None if row is None else _job(row)

    def _stage_started(self, tx: Tx, job_id: str) -> datetime | None:
        started: datetime | None = tx.scalar(select(J.c.stage_started_at).where(J.c.id == job_id))
        return started

    def _insert(self, tx: Tx, jobs: Sequence[Job]) -> None:
        tx.execute(insert(J), [_plain(asdict(job)) for job in jobs])

    def _set(self, tx: Tx, job: Job, values: Values, fence: Fence) -> bool:
        stmt = update(J).where(
            J.c.id == job.id, J.c.status == job.status.value, J.c.version == job.version
        )
        if fence.lease is not None:
            lease = fence.lease
            stmt = stmt.where(J.c.lease_owner == lease.owner, J.c.attempt == lease.attempt)
        if fence.silent_before is not None:
            stmt = stmt.where(_silent(fence.silent_before))
        result = tx.execute(stmt.values(version=J.c.version + 1, **_plain(values)))
        return bool(result.rowcount == 1)

    def _fenced(self, lease: Lease) -> Any:
        return update(J).where(
            J.c.id == lease.job_id,
            J.c.status == JobStatus.RUNNING.value,
            J.c.lease_owner == lease.owner,
            J.c.attempt == lease.attempt,
        )

    def _update_held(self, tx: Tx, lease: Lease, values: Values) -> bool:
        result = tx.execute(self._fenced(lease).values(version=J.c.version + 1, **_plain(values)))
        return bool(result.rowcount == 1)

    def _beat(self, tx: Tx, lease: Lease, now: datetime) -> bool:
        return bool(tx.execute(self._fenced(lease).values(heartbeat_at=now)).rowcount == 1)

    def _lock_parent(self, tx: Tx, parent_id: str | None) -> None:
        if parent_id is not None and not self.db.is_sqlite:
            tx.execute(select(J.c.id).where(J.c.id == parent_id).with_for_update()).first()

    def _lock_for_rescue(self, tx: Tx, job_id: str) -> bool:
        if self.db.is_sqlite:  # one writer at a time already
            return True
        held = tx.execute(
            select(J.c.id).where(J.c.id == job_id).with_for_update(skip_locked=True)
        ).first()
        return held is not None

    def _parts(self, tx: Tx, parent_id: str) -> list[Job]:
        rows = tx.execute(select(J).where(J.c.parent_id == parent_id).order_by(J.c.id))
        return [_job(row) for row in rows]

    def _show_progress(self, tx: Tx, parent_id: str, sums: Summed, now: datetime) -> None:
        tx.execute(
            update(J)
            .where(
                J.c.id == parent_id,
                J.c.status == JobStatus.RUNNING.value,
                J.c.lease_owner.is_(None),
            )
            .values(
                stage=sums.stage.value,
                total_chunks=sums.total_chunks,
                processed_chunks=sums.processed_chunks,
                heartbeat_at=now,
                updated_at=now,
            )
        )

    def _delete_parts(self, tx: Tx, parent_id: str) -> None:
        tx.execute(delete(J).where(J.c.parent_id == parent_id))

    def _add_outbox(self, tx: Tx, job_id: str, now: datetime, available_at: datetime) -> None:
        tx.execute(
            insert(O).values(
                job_id=job_id, created_at=now, available_at=available_at, publish_attempts=0
            )
        )

    def _add_events(self, tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            tx.execute(insert(E), list(rows))

    def _last_change(self, tx: Tx, job_id: str) -> dict[str, Any] | None:
        row = tx.execute(
            select(E)
            .where(E.c.job_id == job_id, E.c.kind == CHANGE)
            .order_by(E.c.id.desc())
            .limit(1)
        ).first()
        return None if row is None else dict(row._mapping)

    def _silent_running(self, tx: Tx, stale_before: datetime) -> list[tuple[str, str | None]]:
        found = tx.execute(
            select(J.c.id, J.c.parent_id).where(
                J.c.status == JobStatus.RUNNING.value, _silent(stale_before)
            )
        )
        return [(job_id, parent_id) for job_id, parent_id in found]

    # --- the outbox and the figures -------------------------------------------------------------
    def due_outbox(self, *, now: datetime, limit: int) -> list[OutboxItem]:
        with self.db.read() as conn:
            stmt = (
                select(O.c.id, O.c.job_id, O.c.publish_attempts)
                .where(O.c.published_at.is_(None), O.c.available_at <= now)
                .order_by(O.c.id)
                .limit(limit)
            )
            return [OutboxItem(r.id, r.job_id, r.publish_attempts) for r in conn.execute(stmt)]

    def mark_published(self, item_ids: Sequence[int], *, now: datetime) -> None:
        if not item_ids:
            return
        with self.db.write() as conn:
            conn.execute(
                update(O)
                .where(O.c.id.in_(item_ids))
                .values(published_at=now, publish_attempts=O.c.publish_attempts + 1)
            )

    def mark_publish_failed(self, item_id: int, error: str) -> None:
        with self.db.write() as conn:
            conn.execute(
                update(O)
                .where(O.c.id == item_id)
                .values(publish_attempts=O.c.publish_attempts + 1, last_error=error[:2000])
            )

    def publish_outbox(
        self, *, now: datetime, limit: int, publish: Callable[[str, str], None]
    ) -> tuple[int, str | None]:
        due = (
            select(O.c.id, O.c.job_id, func.coalesce(J.c.kind, "ingest"))
            .outerjoin(J, J.c.id == O.c.job_id)
            .where(O.c.published_at.is_(None), O.c.available_at <= now)
            .order_by(O.c.id)
            .limit(limit)
        )
        if not self.db.is_sqlite:  # SQLite's BEGIN IMMEDIATE already lets one writer in
            due = due.with_for_update(of=O, skip_locked=True)
        published: list[int] = []
        error: str | None = None
        with self.db.write() as conn:
            if not self.db.is_sqlite:  # a broker that hangs must not hold the rows for long
                conn.exec_driver_sql(
                    f"SET LOCAL idle_in_transaction_session_timeout = '{PUBLISH_HOLD_LIMIT_S}s'"
                )
            for item_id, job_id, kind in conn.execute(due).all():
                try:
                    publish(job_id, kind)
                except Exception as exc:  # the broker refused: keep the row for the next pass
                    error = f"{type(exc).__name__}: {exc}"
                    conn.execute(
                        update(O)
                        .where(O.c.id == item_id)
                        .values(publish_attempts=O.c.publish_attempts + 1, last_error=error[:2000])
                    )
                    break
                published.append(item_id)
            if published:
                conn.execute(
                    update(O)
                    .where(O.c.id.in_(published))
                    .values(published_at=now, publish_attempts=O.c.publish_attempts + 1)
                )
        return len(published), error

    def requeue_unclaimed(self, *, published_before: datetime, now: datetime) -> int:
        recent = exists().where(
            O.c.job_id == J.c.id,
            or_(O.c.published_at.is_(None), O.c.published_at >= published_before),
        )
        runnable = select(J.c.id).where(
            J.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
            or_(J.c.run_after.is_(None), J.c.run_after <= now),
            ~recent,
        )
        with self.db.write() as conn:
            ids = conn.scalars(runnable).all()
            for job_id in ids:
                self._add_outbox(conn, job_id, now, now)
            return len(ids)

    def prune_outbox(self, *, published_before: datetime) -> int:
        with self.db.write() as conn:
            result = conn.execute(
                delete(O).where(O.c.published_at.is_not(None), O.c.published_at < published_before)
            )
            return int(result.rowcount)

    # --- the record of changes ------------------------------------------------------------------
    def record_after(self, *, after: int, limit: int) -> list[tuple[int, Change | None]]:
        with self.db.read() as conn:
            rows = conn.execute(select(E).where(E.c.id > after).order_by(E.c.id).limit(limit))
            return [(row.id, change_of(row) if row.kind == CHANGE else None) for row in rows]

    def changes(
        self,
        *,
        after: int,
        through: int,
        limit: int,
        job_id: str | None = None,
        dataset_id: str | None = None,
    ) -> list[Change]:
        stmt = select(E).where(E.c.kind == CHANGE, E.c.id > after, E.c.id <= through)
        if job_id is not None:
            stmt = stmt.where(E.c.job_id == job_id)
        if dataset_id is not None:
            stmt = stmt.where(E.c.dataset_id == dataset_id)
        with self.db.read() as conn:
            return [change_of(row) for row in conn.execute(stmt.order_by(E.c.id).limit(limit))]

    def last_event_id(self) -> int:
        with self.db.read() as conn:
            return int(conn.scalar(select(func.max(E.c.id))) or 0)

    def prune_changes(self, *, before: datetime) -> int:
        with self.db.write() as conn:
            newest = conn.scalar(select(func.max(E.c.id))) or 0
            result = conn.execute(
                delete(E).where(E.c.kind == CHANGE, E.c.at < before, E.c.id < newest)
            )
            return int(result.rowcount)

    def metrics(self, *, now: datetime) -> JobMetrics:
        counted_kinds = J.c.kind.not_in(sorted(self.silent_kinds))
        with self.db.read() as conn:
            by_status = {
                status: int(count)
                for status, count in conn.execute(
                    select(J.c.status, func.count()).where(counted_kinds).group_by(J.c.status)
                )
            }
            waiting_since = conn.scalar(
                select(func.min(func.coalesce(J.c.run_after, J.c.created_at))).where(
                    J.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
                    or_(J.c.run_after.is_(None), J.c.run_after <= now),
                    counted_kinds,
                )
            )
            beats = conn.scalars(  # a job waiting on its parts has no worker to beat for it
                select(J.c.heartbeat_at).where(
                    J.c.status == JobStatus.RUNNING.value, ~_WAITING_ON_PARTS, counted_kinds
                )
            ).all()
            outcomes = {
                (kind, category or ""): int(count)
                for kind, category, count in conn.execute(
                    select(E.c.kind, E.c.category, func.count())
                    .where(E.c.kind.in_(sorted(OUTCOMES)))
                    .group_by(E.c.kind, E.c.category)
                )
            }
            stages = {
                stage: (int(count), float(total or 0.0))
                for stage, count, total in conn.execute(
                    select(E.c.stage, func.count(), func.sum(E.c.seconds))
                    .where(E.c.kind == "stage")
                    .group_by(E.c.stage)
                )
            }
        backlog, oldest = self.outbox_backlog(now=now)
        return JobMetrics(
            jobs_by_status=by_status,
            outbox_backlog=backlog,
            outbox_oldest_age_s=oldest,
            oldest_waiting_age_s=age(waiting_since, now),
            running_heartbeat_ages_s=[age(beat, now) for beat in beats],
            outcomes=outcomes,
            stage_seconds=stages,
        )

    def outbox_backlog(self, *, now: datetime) -> tuple[int, float]:
        with self.db.read() as conn:
            row = conn.execute(
                select(func.count(), func.min(O.c.available_at)).where(
                    and_(O.c.published_at.is_(None), O.c.available_at <= now)
                )
            ).one()
        count, oldest = row
        if not count or oldest is None:
            return 0, 0.0
        return int(count), max(0.0, (now - oldest).total_seconds())
