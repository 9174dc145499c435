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

from knowledgeops.clock import utcnow
from knowledgeops.jobs.model import JobMetrics
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.datasets import Datasets
from knowledgeops.service.documents import Documents
from knowledgeops.service.jobs import Jobs
from knowledgeops.service.keys import ApiKeys
from knowledgeops.service.search import Search
from knowledgeops.service.uploads import Uploads
from knowledgeops.settings import Settings


@dataclass(frozen=True, slots=True)
class Admission:
    """Who may call, how often, and with how large an upload."""

    auth: bool  # False: KOPS_AUTH=off, every request acts for the default tenant
    rate_limit: str  # per API key, in limits' notation (1200/minute)
    rate_limit_url: str | None  # the Redis all API processes count in; None: in this process
    metrics_token: SecretStr | None  # /metrics needs it as a bearer token when set
    max_upload_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Admission:
        cache = settings.cache_url
        return cls(
            auth=settings.auth == "on",
            rate_limit=settings.rate_limit,
            rate_limit_url=cache.get_secret_value() if cache is not None else None,
            metrics_token=settings.metrics_token,
            max_upload_bytes=settings.max_upload_bytes,
        )


class KnowledgeBase:
    def __init__(
        self,
        *,
        datasets: Datasets,
        documents: Documents,
        uploads: Uploads,
        jobs: Jobs,
        search: Search,
        keys: ApiKeys,
        store: JobStore,
        admission: Admission,
        readiness: Callable[[], dict[str, object]],
    ) -> None:
        self.datasets = datasets
        self.documents = documents
        self.uploads = uploads
        self.jobs = jobs
        self.search = search
        self.keys = keys
        self.admission = admission
        self._store = store
        self._readiness = readiness

    def metrics(self) -> JobMetrics:
        """Jobs by status, outbox backlog, waiting and heartbeat ages, outcomes and stage times
        of the whole deployment, read from the database now."""
        return self._store.metrics(now=utcnow())

    def readiness(self) -> dict[str, object]:
        """What /readyz reports for this process; `ready` says whether it can serve."""
        return self._readiness()
