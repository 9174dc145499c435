"""Prometheus metrics at /metrics, read from the database at each scrape: the database is the
truth for every job, so every API process reports the same numbers for the whole deployment
(workers on other machines included). Process metrics (memory, CPU, open files) are this API
process's own."""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from knowledgeops.errors import Unauthorized
from knowledgeops.jobs.model import JobMetrics
from knowledgeops.jobs.states import JobStatus
from knowledgeops.service.knowledge_base import KnowledgeBase

router = APIRouter(tags=["health"])

HEARTBEAT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0)  # s


class JobsCollector(Collector):
    def __init__(self, service: KnowledgeBase) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from render(self.service.metrics())


def render(m: JobMetrics) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("kops_jobs", "Jobs by status.", labels=["status"])
    for status in JobStatus:
        jobs.add_metric([status.value], m.jobs_by_status.get(status.value, 0))
    yield jobs
    yield GaugeMetricFamily(
        "kops_outbox_backlog", "Outbox rows due and not yet published.", value=m.outbox_backlog
    )
    yield GaugeMetricFamily(
        "kops_outbox_oldest_age_seconds",
        "Age of the oldest due outbox row not yet published.",
        value=m.outbox_oldest_age_s,
    )
    yield GaugeMetricFamily(
        "kops_oldest_waiting_job_age_seconds",
        "How long the oldest job that could run now has waited for a worker.",
        value=m.oldest_waiting_age_s,
    )
    beats = HistogramMetricFamily(
        "kops_running_job_heartbeat_age_seconds",
        "Seconds since each running job's last heartbeat.",
    )
    buckets = [
        (f"{bound:g}", sum(1 for age in m.running_heartbeat_ages_s if age <= bound))
        for bound in HEARTBEAT_BUCKETS
    ]
    buckets.append(("+Inf", len(m.running_heartbeat_ages_s)))
    beats.add_metric([], buckets, sum_value=sum(m.running_heartbeat_ages_s))
    yield beats
    outcomes = CounterMetricFamily(
        "kops_job_outcomes",
        "Attempts that ended, by outcome (completed, retry, failed, cancelled) and error category.",
        labels=["outcome", "category"],
    )
    for (kind, category), count in sorted(m.outcomes.items()):
        outcomes.add_metric([kind, category], count)
    yield outcomes
    stages = SummaryMetricFamily(
        "kops_stage_duration_seconds", "Time spent in each finished stage.", labels=["stage"]
    )
    for stage, (count, total) in sorted(m.stage_seconds.items()):
        stages.add_metric([stage], count_value=count, sum_value=total)
    yield stages


def registry_for(service: KnowledgeBase) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(service))
    ProcessCollector(registry=registry)
    return registry


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Open, unless KOPS_METRICS_TOKEN is set: then only with `Authorization: Bearer <token>`
    (the figures are deployment-wide, so an API key of one tenant is not enough)."""
    token = request.app.state.service.admission.metrics_token
    if token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.get_secret_value().encode()
        ):
            raise Unauthorized(
                "/metrics needs `Authorization: Bearer <KOPS_METRICS_TOKEN>`",
                code="unauthorized",
            )
    registry: CollectorRegistry = request.app.state.metrics
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
