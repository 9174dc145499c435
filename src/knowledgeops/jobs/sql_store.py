"""`JobStore` on SQLAlchemy Core: the same statements run on SQLite and PostgreSQL.

Every status change is compare-and-set (`WHERE status = :seen AND version = :seen_version`), and a
worker's writes are also fenced by `lease_owner` and `attempt`. A lost race is retried from a fresh
read a few times before it is reported.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import Connection, Row, and_, delete, exists, func, insert, or_, select, update

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import ingest_jobs as J
from knowledgeops.db.schema import job_events as E
from knowledgeops.db.schema import outbox as O
from knowledgeops.jobs import states
from knowledgeops.jobs.events import age, counted, failure_event, outcome_event, stage_event
from knowledgeops.jobs.model import Failure, Job, JobMetrics, Lease, NewJob, OutboxItem
from knowledgeops.jobs.parts import PART_KIND, PartState, part_budget, summed
from knowledgeops.jobs.states import OPEN, Event, JobStatus, Stage
from knowledgeops.jobs.store import (
    Guard,
    JobNotFound,
    LeaseLost,
    PartsWork,
    TransitionListener,
    Tx,
    Work,
)
from knowledgeops.jobs.values import cancel_values, completed_values, failure_values

CAS_TRIES = 5
_OPEN = [status.value for status in OPEN]
P = J.alias("part")
# a running job that split and waits on parts still at work: no worker holds it, none is lost
_WAITING_ON_PARTS = exists().where(P.c.parent_id == J.c.id, P.c.status.in_(_OPEN))


def _job(row: Row[Any]) -> Job:
    values = row._asdict()
    values.pop("stage_started_at", None)
    values["status"] = JobStatus(values["status"])
    values["stage"] = Stage(values["stage"])
    return Job(**values)


PUBLISH_HOLD_LIMIT_S = 60  # s: PostgreSQL ends a publishing relay's transaction idle this long


class SqlJobStore:
    def __init__(self, db: Database, listener: TransitionListener | None = None) -> None:
        self.db = db
        self.listener = listener

    # --- helpers --------------------------------------------------------------------------------
    @contextmanager
    def _tx(self, tx: Tx) -> Iterator[Connection]:
        if tx is not None:
            yield tx
        else:
            with self.db.write() as conn:
                yield conn

    @staticmethod
    def _load(conn: Connection, job_id: str) -> Job | None:
        row = conn.execute(select(J).where(J.c.id == job_id)).first()
        return None if row is None else _job(row)

    @staticmethod
    def _add_outbox(conn: Connection, job_id: str, now: datetime, available_at: datetime) -> None:
        conn.execute(
            insert(O).values(
                job_id=job_id, created_at=now, available_at=available_at, publish_attempts=0
            )
        )

    @staticmethod
    def _events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            conn.execute(insert(E), list(rows))

    def _lock_parent(self, conn: Connection, parent_id: str | None) -> None:
        """Rows are locked parent before part (PostgreSQL), by every writer that touches both:
        a part's transitions and reports, the parent's cancel and its parts' propagation."""
        if parent_id is not None and not self.db.is_sqlite:
            conn.execute(select(J.c.id).where(J.c.id == parent_id).with_for_update()).first()

    def _cas(
        self,
        conn: Connection,
        job: Job,
        event: Event,
        now: datetime,
        values: dict[str, Any],
        lease: Lease | None = None,
        also: Any = None,
    ) -> bool:
        """Move `job` by `event` if nobody changed it since it was read; tell the listener (or,
        for a part, carry the change to its parent and siblings)."""
        new_status = states.target(job.status, event)
        self._lock_parent(conn, job.parent_id)
        stmt = update(J).where(
            J.c.id == job.id, J.c.status == job.status.value, J.c.version == job.version
        )
        if lease is not None:
            stmt = stmt.where(J.c.lease_owner == lease.owner, J.c.attempt == lease.attempt)
        if also is not None:
            stmt = stmt.where(also)
        plain = {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}
        result = conn.execute(
            stmt.values(status=new_status.value, version=J.c.version + 1, updated_at=now, **plain)
        )
        if result.rowcount != 1:
            return False
        if job.parent_id is not None:
            self._part_moved(conn, job, new_status, now)
            return True
        if self.listener is not None:
            self.listener.on_transition(conn, job, new_status)
        if new_status in (JobStatus.FAILED, JobStatus.CANCELLED):
            self._cancel_parts(conn, job.id, now)
        return True

    # --- parts (jobs/parts.py) ------------------------------------------------------------------
    def _part_moved(
        self, conn: Connection, part: Job, new_status: JobStatus, now: datetime
    ) -> None:
        parent_id = part.parent_id
        assert parent_id is not None
        parent = self._load(conn, parent_id)
        if parent is None or parent.status is not JobStatus.RUNNING:
            return
        if new_status is JobStatus.FAILED:
            failed = self._load(conn, part.id)
            assert failed is not None
            failure = Failure(
                failed.error or "a part of this job failed",
                failed.error_code or "part_failed",
                failed.error_category or "permanent",
                failed.retryable,
            )
            if self._cas(conn, parent, Event.FAIL, now, failure_values(failure, now, None)):
                self._events(conn, [failure_event(parent, failure, now, None)])
            return
        if new_status is JobStatus.CANCELLED:
            if self._cas(conn, parent, Event.CANCEL, now, cancel_values(now)):
                self._events(conn, [outcome_event(parent, "cancelled", now)])
            return
        if new_status is JobStatus.COMPLETED and self._all_completed(conn, parent_id):
            written = self._sum_processed(conn, parent_id)
            values = {
                **completed_values(now),
                "total_chunks": written,
                "processed_chunks": written,
                "heartbeat_at": now,
            }
            if self._cas(conn, parent, Event.COMPLETE, now, values):
                self._events(conn, [outcome_event(parent, "completed", now)])
            return
        self._refresh_parent(conn, parent_id, now)

    @staticmethod
    def _all_completed(conn: Connection, parent_id: str) -> bool:
        others = conn.scalar(
            select(func.count()).where(
                J.c.parent_id == parent_id, J.c.status != JobStatus.COMPLETED.value
            )
        )
        return not others

    @staticmethod
    def _sum_processed(conn: Connection, parent_id: str) -> int:
        total = conn.scalar(
            select(func.sum(J.c.processed_chunks)).where(J.c.parent_id == parent_id)
        )
        return int(total or 0)

    def _refresh_parent(self, conn: Connection, parent_id: str, now: datetime) -> None:
        """Show the parts' summed progress on their parent (no version change: progress is not
        state a compare-and-set guards)."""
        rows = conn.execute(
            select(J.c.status, J.c.stage, J.c.total_chunks, J.c.processed_chunks).where(
                J.c.parent_id == parent_id
            )
        ).all()
        sums = summed(PartState(JobStatus(r[0]), Stage(r[1]), r[2], r[3]) for r in rows)
        conn.execute(
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

    def _cancel_parts(self, conn: Connection, parent_id: str, now: datetime) -> None:
        """End the parts still at work of a job that failed or was cancelled."""
        ids = conn.scalars(  # in id order, as heartbeats take them: no lock cycle
            select(J.c.id).where(J.c.parent_id == parent_id, J.c.status.in_(_OPEN)).order_by(J.c.id)
        ).all()
        for part_id in ids:
            part = self._load(conn, part_id)
            if part is not None and part.status in OPEN:
                self._cas(conn, part, Event.CANCEL, now, cancel_values(now))

    def _transition(
        self,
        job_id: str,
        event: Event,
        now: datetime,
        values: Callable[[Job], dict[str, Any]],
        *,
        lease: Lease | None = None,
        outbox_at: Callable[[Job], datetime | None] | None = None,
        guard: Guard | None = None,
        events: Callable[[Job, Any], Sequence[dict[str, Any]]] | None = None,
    ) -> Job:
        for _ in range(CAS_TRIES):
            with self.db.write() as conn:
                job = self._load(conn, job_id)
                if job is None:
                    if lease is not None:
                        raise LeaseLost(lease, None)
                    raise JobNotFound(job_id)
                if lease is not None and not _holds(job, lease):
                    raise LeaseLost(lease, job.status)
                if guard is not None:
                    guard(conn, job)
                stage_started = (
                    conn.scalar(select(J.c.stage_started_at).where(J.c.id == job_id))
                    if events is not None
                    else None
                )
                if self._cas(conn, job, event, now, values(job), lease):
                    if events is not None:
                        self._events(conn, counted(job, events(job, stage_started)))
                    available = outbox_at(job) if outbox_at else None
                    if available is not None:
                        self._add_outbox(conn, job_id, now, available)
                    loaded = self._load(conn, job_id)
                    assert loaded is not None
                    return loaded
        raise states.InvalidTransition(f"job {job_id} kept changing; try again")

    # --- creating and reading -------------------------------------------------------------------
    def add(self, new: NewJob, *, now: datetime, tx: Tx = None) -> Job:
        with self._tx(tx) as conn:
            conn.execute(
                insert(J).values(
                    id=new.id,
                    document_id=new.document_id,
                    dataset_id=new.dataset_id,
                    kind=new.kind,
                    generation=new.generation,
                    status=JobStatus.PENDING.value,
                    stage=Stage.QUEUED.value,
                    processed_chunks=0,
                    retryable=False,
                    attempt=0,
                    max_attempts=new.max_attempts,
                    version=1,
                    idempotency_key=new.idempotency_key,
                    created_at=now,
                    updated_at=now,
                )
            )
            self._add_outbox(conn, new.id, now, now)
            job = self._load(conn, new.id)
            assert job is not None
            return job

    def get(self, job_id: str) -> Job | None:
        with self.db.read() as conn:
            return self._load(conn, job_id)

    def find_by_idempotency_key(self, key: str) -> Job | None:
        with self.db.read() as conn:
            row = conn.execute(select(J).where(J.c.idempotency_key == key)).first()
            return None if row is None else _job(row)

    # --- a worker's writes ----------------------------------------------------------------------
    def claim(self, job_id: str, owner: str, *, now: datetime) -> Lease | None:
        with self.db.write() as conn:
            job = self._load(conn, job_id)
            if job is None or job.status not in states.sources(Event.CLAIM):
                return None
            if not job.is_due(now):
                return None
            attempt = job.attempt + 1
            claimed = self._cas(
                conn,
                job,
                Event.CLAIM,
                now,
                {
                    "attempt": attempt,
                    "lease_owner": owner,
                    "heartbeat_at": now,
                    "started_at": now,
                    "finished_at": None,
                    "stage": Stage.QUEUED.value,
                    "stage_started_at": now,
                    "total_chunks": None,
                    "processed_chunks": 0,
                    "run_after": None,
                },
            )
            return Lease(job_id, owner, attempt, job.parent_id) if claimed else None

    def _fenced(self, lease: Lease) -> Any:
        return update(J).where(
            J.c.id == lease.job_id,
            J.c.status == JobStatus.RUNNING.value,
            J.c.lease_owner == lease.owner,
            J.c.attempt == lease.attempt,
        )

    def report(
        self,
        lease: Lease,
        *,
        now: datetime,
        stage: Stage | None = None,
        total: int | None = None,
        processed: int | None = None,
        work: Work | None = None,
    ) -> None:
        values: dict[str, Any] = {"heartbeat_at": now, "updated_at": now}
        if stage is not None:
            values["stage"] = stage.value
        if total is not None:
            values["total_chunks"] = total
        if processed is not None:
            values["processed_chunks"] = processed
        with self.db.write() as conn:
            self._lock_parent(conn, lease.parent_id)
            before = None
            if stage is not None:
                before = conn.execute(
                    select(J.c.stage, J.c.stage_started_at).where(J.c.id == lease.job_id)
                ).first()
                if before is not None and before.stage != stage.value:
                    values["stage_started_at"] = now
            result = conn.execute(self._fenced(lease).values(version=J.c.version + 1, **values))
            if result.rowcount != 1:
                job = self._load(conn, lease.job_id)
                raise LeaseLost(lease, job.status if job else None)
            if before is not None and "stage_started_at" in values:
                self._events(
                    conn, stage_event(lease.job_id, before.stage, before.stage_started_at, now)
                )
            if work is not None:
                work(conn)
            if lease.parent_id is not None:
                self._refresh_parent(conn, lease.parent_id, now)

    def heartbeat(self, leases: Sequence[Lease], *, now: datetime) -> list[Lease]:
        lost = []
        with self.db.write() as conn:
            for lease in leases:
                result = conn.execute(self._fenced(lease).values(heartbeat_at=now))
                if result.rowcount != 1:
                    lost.append(lease)
        return lost

    def complete(self, lease: Lease, *, now: datetime) -> Job:
        return self._transition(
            lease.job_id,
            Event.COMPLETE,
            now,
            lambda job: completed_values(now),
            lease=lease,
            events=lambda job, started: [
                *stage_event(job.id, job.stage.value, started, now),
                outcome_event(job, "completed", now),
            ],
        )

    def fail(
        self, lease: Lease, failure: Failure, *, now: datetime, retry_at: datetime | None
    ) -> Job:
        event = Event.FAIL if retry_at is None else Event.RETRY_LATER
        return self._transition(
            lease.job_id,
            event,
            now,
            lambda job: failure_values(failure, now, retry_at),
            lease=lease,
            outbox_at=lambda job: retry_at,
            events=lambda job, _: [failure_event(job, failure, now, retry_at)],
        )

    def release(self, lease: Lease, *, now: datetime) -> Job:
        return self._transition(
            lease.job_id,
            Event.RETRY_LATER,
            now,
            lambda job: {
                "attempt": job.attempt - 1,
                "lease_owner": None,
                "run_after": now,
                "stage": Stage.QUEUED.value,
            },
            lease=lease,
            outbox_at=lambda job: now,
        )

    def split(self, lease: Lease, parts: int, *, now: datetime, work: PartsWork) -> list[str]:
        if parts < 1:
            raise ValueError("a job splits into one part or more")
        with self.db.write() as conn:
            before = conn.execute(
                select(J.c.stage, J.c.stage_started_at).where(J.c.id == lease.job_id)
            ).first()
            result = conn.execute(
                self._fenced(lease).values(
                    lease_owner=None,
                    stage=Stage.PARSING.value,
                    stage_started_at=now,
                    total_chunks=None,
                    processed_chunks=0,
                    heartbeat_at=now,
                    updated_at=now,
                    version=J.c.version + 1,
                )
            )
            if result.rowcount != 1:
                job = self._load(conn, lease.job_id)
                raise LeaseLost(lease, job.status if job else None)
            job = self._load(conn, lease.job_id)
            assert job is not None
            assert before is not None
            self._events(conn, stage_event(job.id, before.stage, before.stage_started_at, now))
            conn.execute(delete(J).where(J.c.parent_id == job.id))  # an earlier attempt's
            ids = [str(uuid.uuid4()) for _ in range(parts)]
            budget = part_budget(job.max_attempts, job.attempt)
            conn.execute(
                insert(J),
                [
                    {
                        "id": part_id,
                        "parent_id": job.id,
                        "document_id": job.document_id,
                        "dataset_id": job.dataset_id,
                        "kind": PART_KIND,
                        "generation": job.generation,
                        "status": JobStatus.PENDING.value,
                        "stage": Stage.QUEUED.value,
                        "processed_chunks": 0,
                        "retryable": False,
                        "attempt": 0,
                        "max_attempts": budget,
                        "version": 1,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for part_id in ids
                ],
            )
            for part_id in ids:
                self._add_outbox(conn, part_id, now, now)
            work(conn, ids)
            return ids

    # --- operator actions -----------------------------------------------------------------------
    def cancel(self, job_id: str, *, now: datetime) -> Job:
        return self._transition(
            job_id,
            Event.CANCEL,
            now,
            lambda job: cancel_values(now),
            events=lambda job, _: [outcome_event(job, "cancelled", now)],
        )

    def requeue(
        self, job_id: str, *, now: datetime, extra_attempts: int, guard: Guard | None = None
    ) -> Job:
        return self._transition(
            job_id,
            Event.REQUEUE,
            now,
            lambda job: {
                "max_attempts": job.attempt + extra_attempts,
                "stage": Stage.QUEUED.value,
                "finished_at": None,
                "run_after": now,  # due now; also where its wait for a worker starts
                "error": None,
                "error_code": None,
                "error_category": None,
                "retryable": False,
                "total_chunks": None,
                "processed_chunks": 0,
            },
            outbox_at=lambda job: now,
            guard=guard,
        )

    # --- the relay's scans ----------------------------------------------------------------------
    def rescue_stale(
        self,
        *,
        stale_before: datetime,
        now: datetime,
        failure: Failure,
        retry_at: Callable[[Job], datetime | None],
    ) -> list[Job]:
        with self.db.read() as conn:
            found = conn.execute(
                select(J.c.id, J.c.parent_id).where(
                    J.c.status == JobStatus.RUNNING.value,
                    or_(J.c.heartbeat_at.is_(None), J.c.heartbeat_at < stale_before),
                    ~_WAITING_ON_PARTS,
                )
            ).all()
        rescued = []
        for job_id, parent_id in found:
            with self.db.write() as conn:
                self._lock_parent(conn, parent_id)
                if not self.db.is_sqlite:  # a frozen worker may hold the row: skip it this pass
                    held = conn.execute(
                        select(J.c.id).where(J.c.id == job_id).with_for_update(skip_locked=True)
                    ).first()
                    if held is None:
                        continue
                job = self._load(conn, job_id)
                if job is None or job.status is not JobStatus.RUNNING:
                    continue
                if job.heartbeat_at is not None and job.heartbeat_at >= stale_before:
                    continue
                when = retry_at(job)
                event = Event.FAIL if when is None else Event.RETRY_LATER
                values = failure_values(failure, now, when)
                still_silent = and_(
                    or_(J.c.heartbeat_at.is_(None), J.c.heartbeat_at < stale_before),
                    ~_WAITING_ON_PARTS,
                )
                if self._cas(conn, job, event, now, values, also=still_silent):
                    self._events(conn, counted(job, [failure_event(job, failure, now, when)]))
                    if when is not None:
                        self._add_outbox(conn, job_id, now, when)
                    loaded = self._load(conn, job_id)
                    assert loaded is not None
                    rescued.append(loaded)
        return rescued

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
        self, *, now: datetime, limit: int, publish: Callable[[str], None]
    ) -> tuple[int, str | None]:
        due = (
            select(O.c.id, O.c.job_id)
            .where(O.c.published_at.is_(None), O.c.available_at <= now)
            .order_by(O.c.id)
            .limit(limit)
        )
        if not self.db.is_sqlite:  # SQLite's BEGIN IMMEDIATE already lets one writer in
            due = due.with_for_update(skip_locked=True)
        published: list[int] = []
        error: str | None = None
        with self.db.write() as conn:
            if not self.db.is_sqlite:  # a broker that hangs must not hold the rows for long
                conn.exec_driver_sql(
                    f"SET LOCAL idle_in_transaction_session_timeout = '{PUBLISH_HOLD_LIMIT_S}s'"
                )
            for item_id, job_id in conn.execute(due).all():
                try:
                    publish(job_id)
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

    def metrics(self, *, now: datetime) -> JobMetrics:
        with self.db.read() as conn:
            by_status = {
                status: int(count)
                for status, count in conn.execute(
                    select(J.c.status, func.count()).group_by(J.c.status)
                )
            }
            waiting_since = conn.scalar(
                select(func.min(func.coalesce(J.c.run_after, J.c.created_at))).where(
                    J.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
                    or_(J.c.run_after.is_(None), J.c.run_after <= now),
                )
            )
            beats = conn.scalars(  # a job waiting on its parts has no worker to beat for it
                select(J.c.heartbeat_at).where(
                    J.c.status == JobStatus.RUNNING.value, ~_WAITING_ON_PARTS
                )
            ).all()
            outcomes = {
                (kind, category or ""): int(count)
                for kind, category, count in conn.execute(
                    select(E.c.kind, E.c.category, func.count())
                    .where(E.c.kind != "stage")
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


def _holds(job: Job, lease: Lease) -> bool:
    return (
        job.status is JobStatus.RUNNING
        and job.lease_owner == lease.owner
        and job.attempt == lease.attempt
    )
