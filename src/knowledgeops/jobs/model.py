"""What the jobs core reads and writes: a job, a new job, a lease, a change, an outbox item,
metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from knowledgeops.jobs.states import JobStatus, Stage


@dataclass(frozen=True, slots=True)
class NewJob:
    id: str
    document_id: str | None  # None: a job on a whole dataset (e.g. a re-embed)
    dataset_id: str
    generation: int
    max_attempts: int
    kind: str = "ingest"
    idempotency_key: str | None = None

    def pending(self, now: datetime) -> Job:
        """The job as it is added: pending, queued, no attempt yet."""
        return Job(
            id=self.id,
            document_id=self.document_id,
            dataset_id=self.dataset_id,
            kind=self.kind,
            generation=self.generation,
            status=JobStatus.PENDING,
            stage=Stage.QUEUED,
            total_chunks=None,
            processed_chunks=0,
            error=None,
            error_code=None,
            error_category=None,
            retryable=False,
            attempt=0,
            max_attempts=self.max_attempts,
            run_after=None,
            lease_owner=None,
            heartbeat_at=None,
            started_at=None,
            finished_at=None,
            version=1,
            idempotency_key=self.idempotency_key,
            created_at=now,
            updated_at=now,
        )


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    document_id: str | None
    dataset_id: str
    kind: str
    generation: int
    status: JobStatus
    stage: Stage
    total_chunks: int | None
    processed_chunks: int
    error: str | None
    error_code: str | None
    error_category: str | None
    retryable: bool
    attempt: int
    max_attempts: int
    run_after: datetime | None
    lease_owner: str | None
    heartbeat_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    version: int
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime
    parent_id: str | None = None  # set on a part of a split job (see JobStore.split)

    def is_due(self, now: datetime) -> bool:
        return self.run_after is None or self.run_after <= now


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's hold on one attempt of a job; every write the worker makes is fenced by it."""

    job_id: str
    owner: str
    attempt: int
    parent_id: str | None = None  # the job's parent, when it is a part of a split job


@dataclass(frozen=True, slots=True)
class Failure:
    """What a job's failure records: public message, machine code, category, retryable."""

    message: str
    code: str
    category: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class Change:
    """A change of a job a user can see, as recorded (`job_events`, kind `change`): the job as it
    stood after it. `id` orders changes; the event streams resume after one."""

    id: int
    at: datetime
    job_id: str
    dataset_id: str
    document_id: str | None
    status: str
    stage: str
    total: int | None
    processed: int
    attempt: int
    max_attempts: int
    error: str | None
    error_code: str | None
    error_category: str | None
    retryable: bool


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    job_id: str
    publish_attempts: int


@dataclass(frozen=True, slots=True)
class JobMetrics:
    """The state of all jobs at one moment, as `/metrics` reports it. Counters (`outcomes`,
    `stage_seconds`) only grow; the rest are gauges."""

    jobs_by_status: dict[str, int]
    outbox_backlog: int
    outbox_oldest_age_s: float
    oldest_waiting_age_s: float  # the oldest job that could run now and has not started
    running_heartbeat_ages_s: list[float]
    # (kind, category) -> count; kind: completed, retry, failed, cancelled
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    stage_seconds: dict[str, tuple[int, float]] = field(default_factory=dict)  # count, sum
