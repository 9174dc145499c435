"""The primitives a job store supplies, the narrowest seam under `JobStore` (store.py): plain
reads and writes of job, outbox and event rows inside a transaction, each with no rule of its own,
and the queries the relay and /metrics ask. `SqlJobStore` answers them with SQLAlchemy Core,
`MemoryJobStore` with dictionaries; a store that lacks one cannot be made (they are abstract).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from knowledgeops.db.engine import Tx
from knowledgeops.jobs.model import Change, Job, JobMetrics, Lease, OutboxItem
from knowledgeops.jobs.parts import Summed

Values = dict[str, Any]  # columns of a job row, by name (enums as enums)


@dataclass(frozen=True, slots=True)
class Fence:
    """What a compare-and-set requires besides the status and version it read: that `lease`
    still holds the job (its owner and attempt), and, for a rescue, that the job is still silent
    since before `silent_before` and waits on no part."""

    lease: Lease | None = None
    silent_before: datetime | None = None


class JobRows(ABC):
    # --- transactions and rows --------------------------------------------------------------
    @abstractmethod
    def _write(self) -> AbstractContextManager[Tx]:
        """A transaction that may write: commits at the end, rolls all back on an exception."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[Tx]:
        """A read-only transaction (a consistent snapshot)."""

    @contextmanager
    def _joined(self, tx: Tx | None) -> Iterator[Tx]:
        """The caller's transaction when it gives one, else a new one."""
        if tx is not None:
            yield tx
            return
        with self._write() as conn:
            yield conn

    @abstractmethod
    def _load(self, tx: Tx, job_id: str) -> Job | None: ...

    @abstractmethod
    def _load_by_key(self, tx: Tx, key: str) -> Job | None: ...

    @abstractmethod
    def _stage_started(self, tx: Tx, job_id: str) -> datetime | None:
        """When the job's current stage began (kept beside the job, not on `Job`)."""

    @abstractmethod
    def _insert(self, tx: Tx, jobs: Sequence[Job]) -> None: ...

    @abstractmethod
    def _set(self, tx: Tx, job: Job, values: Values, fence: Fence) -> bool:
        """Compare-and-set: write `values` and version + 1 if the row still has `job`'s status
        and version, and passes `fence`. True if written."""

    @abstractmethod
    def _update_held(self, tx: Tx, lease: Lease, values: Values) -> bool:
        """Write `values` and version + 1 while `lease` holds the job (running, its owner, its
        attempt). True if held."""

    @abstractmethod
    def _beat(self, tx: Tx, lease: Lease, now: datetime) -> bool:
        """Refresh the heartbeat while `lease` holds the job (no version change). True if
        held."""

    @abstractmethod
    def _lock_parent(self, tx: Tx, parent_id: str | None) -> None:
        """Rows are locked parent before part, by every writer that touches both (PostgreSQL:
        FOR UPDATE; elsewhere the store's single writer already orders them)."""

    @abstractmethod
    def _lock_for_rescue(self, tx: Tx, job_id: str) -> bool:
        """Lock the job to rescue it; False when another session holds it (a frozen worker)."""

    @abstractmethod
    def _parts(self, tx: Tx, parent_id: str) -> list[Job]: ...

    @abstractmethod
    def _show_progress(self, tx: Tx, parent_id: str, sums: Summed, now: datetime) -> None:
        """Put the parts' summed progress on their parent while it waits on them (running,
        held by no worker); no version change: progress is not state a compare-and-set
        guards."""

    @abstractmethod
    def _delete_parts(self, tx: Tx, parent_id: str) -> None: ...

    @abstractmethod
    def _add_outbox(self, tx: Tx, job_id: str, now: datetime, available_at: datetime) -> None: ...

    @abstractmethod
    def _add_events(self, tx: Tx, rows: Sequence[dict[str, Any]]) -> None: ...

    @abstractmethod
    def _last_change(self, tx: Tx, job_id: str) -> dict[str, Any] | None:
        """The newest `change` row of the job (its columns by name), or None."""

    @abstractmethod
    def _silent_running(self, tx: Tx, stale_before: datetime) -> list[tuple[str, str | None]]:
        """(id, parent id) of running jobs silent since before `stale_before`, not waiting on
        parts."""

    # --- the outbox and the figures: queries each store answers ----------------------------------
    @abstractmethod
    def due_outbox(self, *, now: datetime, limit: int) -> list[OutboxItem]: ...

    @abstractmethod
    def mark_published(self, item_ids: Sequence[int], *, now: datetime) -> None: ...

    @abstractmethod
    def mark_publish_failed(self, item_id: int, error: str) -> None: ...

    @abstractmethod
    def publish_outbox(
        self, *, now: datetime, limit: int, publish: Callable[[str, str], None]
    ) -> tuple[int, str | None]:
        """Hand due outbox rows to `publish(job_id, kind)` in id order and mark them published,
        all in one transaction that holds the rows (FOR UPDATE SKIP LOCKED on PostgreSQL), so
        that two relays never publish the same row. Stops at the first failure, which is
        recorded on its row; returns (rows published, the failure's message or None)."""

    @abstractmethod
    def requeue_unclaimed(self, *, published_before: datetime, now: datetime) -> int:
        """A new outbox row for each runnable job whose last publish is older than the cutoff."""

    @abstractmethod
    def prune_outbox(self, *, published_before: datetime) -> int: ...

    @abstractmethod
    def outbox_backlog(self, *, now: datetime) -> tuple[int, float]:
        """(unpublished rows that are due, age in seconds of the oldest of them)."""

    # --- the record of changes: what the event streams follow --------------------------------
    @abstractmethod
    def record_after(self, *, after: int, limit: int) -> list[tuple[int, Change | None]]:
        """The `job_events` rows after id `after`, in id order, at most `limit`: each row's id
        with its `Change` when it is one (the other rows are metrics). Every id is returned so a
        reader can tell a gap (a transaction not yet committed) from the end."""

    @abstractmethod
    def changes(
        self,
        *,
        after: int,
        through: int,
        limit: int,
        job_id: str | None = None,
        dataset_id: str | None = None,
    ) -> list[Change]:
        """The changes with `after` < id ≤ `through`, of one job or one dataset when given, in
        id order, at most `limit`."""

    @abstractmethod
    def last_event_id(self) -> int:
        """The newest `job_events` id (0 when there is none)."""

    @abstractmethod
    def prune_changes(self, *, before: datetime) -> int:
        """Delete `change` rows older than `before`, keeping the newest row of the record (so
        ids never go back); returns the rows deleted. Metrics rows are kept."""

    @abstractmethod
    def metrics(self, *, now: datetime) -> JobMetrics:
        """Jobs by status, outbox backlog, waiting and heartbeat ages, outcome and stage
        counters (every stage change, retry, failure, cancel and completion is recorded in the
        transaction that makes it)."""
