"""Kinds of job: each kind its handler (`ByKind`) and, where it needs one, its lane (`Lanes`): a
queue and workers of its own, so that one kind's slow work never waits in front of another's.
A webhook delivery that waits on a slow receiver must not hold a worker an upload needs
(docs/architecture.md: Webhooks)."""

from __future__ import annotations

from collections.abc import Mapping

from knowledgeops.jobs.dispatch import Dispatcher
from knowledgeops.jobs.runner import Handler, JobContext


class Lanes:
    """A dispatcher that hands each job to the dispatcher of its kind, or to `default`."""

    def __init__(self, default: Dispatcher, by_kind: Mapping[str, Dispatcher]) -> None:
        self.default = default
        self.by_kind = dict(by_kind)

    def publish(self, job_id: str, kind: str = "ingest") -> None:
        self.by_kind.get(kind, self.default).publish(job_id, kind)

    def backlog(self) -> int | None:
        """What waits in every lane (the relay's measure of a busy broker: while messages
        wait, an unclaimed job is not published again soon), None when one cannot tell."""
        total = 0
        for dispatcher in {id(d): d for d in (self.default, *self.by_kind.values())}.values():
            waiting = dispatcher.backlog()
            if waiting is None:
                return None
            total += waiting
        return total


class ByKind:
    """A handler that hands each job to the handler of its kind, or to `default`: the jobs
    core runs any kind of work the same way (claim, lease, retries, outcome)."""

    def __init__(self, default: Handler, by_kind: Mapping[str, Handler]) -> None:
        self.default = default
        self.by_kind = dict(by_kind)

    def __call__(self, ctx: JobContext) -> None:
        self.by_kind.get(ctx.job.kind, self.default)(ctx)
