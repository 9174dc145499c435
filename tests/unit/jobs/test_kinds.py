"""Kinds of job: `ByKind` runs each job with its kind's handler, `Lanes` sends it to its kind's
queue and counts what waits in all of them."""

from __future__ import annotations

from typing import Any

from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.kinds import ByKind, Lanes


class Job:
    def __init__(self, kind: str) -> None:
        self.kind = kind


class Ctx:
    def __init__(self, kind: str) -> None:
        self.job = Job(kind)


def test_each_kind_goes_to_its_lane_and_the_backlog_counts_every_lane() -> None:
    jobs, webhooks = InProcessQueue(), InProcessQueue()
    lanes = Lanes(jobs, {"webhook": webhooks})
    lanes.publish("a", "ingest")
    lanes.publish("b", "webhook")
    lanes.publish("c", "webhook")
    lanes.publish("d")
    assert (jobs.get(0.1), jobs.get(0.1), jobs.get(0.01)) == ("a", "d", None)
    assert lanes.backlog() == 2  # what still waits: the two deliveries
    assert (webhooks.get(0.1), webhooks.get(0.1)) == ("b", "c")
    assert lanes.backlog() == 0


def test_a_lane_that_cannot_tell_makes_the_backlog_unknown() -> None:
    class Down:
        def publish(self, job_id: str, kind: str = "ingest") -> None:
            raise ConnectionError

        def backlog(self) -> int | None:
            return None

    assert Lanes(InProcessQueue(), {"webhook": Down()}).backlog() is None


def test_each_job_runs_with_its_kinds_handler() -> None:
    ran: list[tuple[str, str]] = []

    def handler(name: str) -> Any:
        return lambda ctx: ran.append((name, ctx.job.kind))

    by_kind = ByKind(handler("pipeline"), {"webhook": handler("deliverer")})
    for kind in ("ingest", "webhook", "reembed"):
        by_kind(Ctx(kind))  # type: ignore[arg-type]
    assert ran == [("pipeline", "ingest"), ("deliverer", "webhook"), ("pipeline", "reembed")]
