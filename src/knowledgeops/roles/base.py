"""What every process role shares: its settings, its clock, its database, start and stop; and
what the roles that handle documents share: the file store, the embedder, the index and the job
store."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from knowledgeops.clock import Clock, utcnow
from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.roles import wiring
from knowledgeops.service.knowledge_base import KnowledgeBase
from knowledgeops.settings import Settings


class Role(ABC):
    """One process role, built from `settings`; `start()` then `stop()`."""

    def __init__(self, settings: Settings, *, clock: Clock = utcnow) -> None:
        self.settings = settings
        self.clock = clock
        self.db = Database(settings.resolved_database_url)

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def database_check(self) -> str:
        """ "ok", or "unavailable: <why>" (for /readyz)."""
        try:
            self.db.ping()
        except Exception as exc:
            return f"unavailable: {type(exc).__name__}"
        return "ok"


class DataRole(Role):
    """A role that handles documents (`kops serve`, `kops api`, `kops worker`): the stored files,
    the embedder (`nice` below the process's priority when the API shares the process), the
    index and the job store over the role's database."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | Sequence[Embedder] | None = None,
        nice: int = 0,
        clock: Clock = utcnow,
    ) -> None:
        super().__init__(settings, clock=clock)
        self.blobs = LocalBlobStore(settings.data_dir)
        self.models = wiring.make_models(settings, self.db, embedder, nice=nice)
        self.embedder = self.models.embedder(self.models.default)  # loaded at start
        self.index = wiring.make_index(self.db, self.embedder.dimension, settings)
        self.store = wiring.make_store(self.db, self.index, settings)

    def use_cases(
        self, *, notify: Callable[[], None], readiness: Callable[[], dict[str, object]]
    ) -> KnowledgeBase:
        """The use cases over this role's database and files, for the API."""
        return wiring.make_knowledge_base(
            self.settings,
            self.db,
            self.blobs,
            self.index,
            self.store,
            self.models,
            notify=notify,
            readiness=readiness,
        )
