"""The one facade the API (and the CLI's direct commands) use: the use cases over one database and
one file store, the deployment's job figures, this process's readiness, and how callers are let in.

Routes reach the use cases through it and nothing else: not the job store, the index or the
settings. The process roles (roles/) build it from the settings and say what readiness means for
their process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from knowledgeops.ingest.embedders.models import Models
from knowledgeops.jobs.model import JobMetrics
from knowledgeops.service.datasets import Datasets
from knowledgeops.service.documents import Documents
from knowledgeops.service.jobs import Jobs
from knowledgeops.service.keys import ApiKeys
from knowledgeops.service.search import Search
from knowledgeops.service.uploads import Uploads
from knowledgeops.service.webhooks import Webhooks
from knowledgeops.settings import Settings


@dataclass(frozen=True, slots=True)
class Admission:
    """Who may call, how often, and with how large an upload."""

    auth: bool  # False: KOPS_AUTH=off, every request acts for the default tenant
    rate_limit: str  # per API key, in limits' notation (1200/minute)
    rate_limit_url: str | None  # the Redis all API processes count in; None: in this process
    metrics_token: SecretStr | None  # /metrics needs it as a bearer token when set
    max_upload_bytes: int
    max_streams_per_key: int = 50  # event streams one key may hold open in one API process
    stream_poll_s: float = 0.2  # how often the process reads new job changes for its streams
    stream_heartbeat_s: float = 15.0  # a comment on an idle stream this often

    @classmethod
    def from_settings(cls, settings: Settings) -> Admission:
        cache = settings.cache_url
        return cls(
            auth=settings.auth == "on",
            rate_limit=settings.rate_limit,
            rate_limit_url=cache.get_secret_value() if cache is not None else None,
            metrics_token=settings.metrics_token,
            max_upload_bytes=settings.max_upload_bytes,
            max_streams_per_key=settings.max_streams_per_key,
            stream_poll_s=settings.stream_poll_s,
            stream_heartbeat_s=settings.stream_heartbeat_s,
        )


@dataclass(frozen=True, eq=False)
class KnowledgeBase:
    datasets: Datasets
    documents: Documents
    uploads: Uploads
    jobs: Jobs
    search: Search
    keys: ApiKeys
    webhooks: Webhooks
    admission: Admission
    models: Models  # the embedding models datasets may choose (GET /models)
    # the whole deployment's jobs by status, outbox backlog, waiting and heartbeat ages, outcomes
    # and stage times, read from the database now (what /metrics reports)
    metrics: Callable[[], JobMetrics]
    # what /readyz reports for this process; `ready` says whether it can serve
    readiness: Callable[[], dict[str, object]]
