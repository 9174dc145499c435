"""The order of a hybrid search's two lists (service/search.py): its words are looked up on
the pool while the query is embedded, and its vector list is searched beside that lookup,
unless the index says this search's scan takes every core (ChunkIndex.scans_every_core,
tested per dataset in tests/integration/test_index_graphs.py) while other processes keep cores
busy (`OtherWork`, measured against real processes in tests/unit/test_cpu.py): then after the
words."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import default_dataset_id, ingest, runtime_of, search
from tests.fixtures.documents import make_text

LOOKUP_S = 0.3  # each keyword lookup is held this long, so the order shows in the times


class Recorded:
    """The service's index, every call passed to it, the two lists' times written down, and
    `scans_every_core` answering what the test sets."""

    def __init__(self, index: Any, every_core: bool) -> None:
        self._index = index
        self.every_core = every_core
        self.times: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    def scans_every_core(self, dataset_id: str, where: Any = None) -> bool:
        return self.every_core

    def search_keyword(self, *args: Any, **kwargs: Any) -> Any:
        threading.Event().wait(LOOKUP_S)
        found = self._index.search_keyword(*args, **kwargs)
        self.times["words found"] = time.monotonic()
        return found

    def search_vector(self, *args: Any, **kwargs: Any) -> Any:
        self.times["vector began"] = time.monotonic()
        return self._index.search_vector(*args, **kwargs)


class Others:
    """Other processes' use of the cores, as the test sets it."""

    def __init__(self, busy: bool) -> None:
        self._busy = busy

    def busy(self) -> bool:
        return self._busy


@pytest.mark.parametrize(
    ("every_core", "others_busy"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_the_vector_list_waits_for_the_words_only_where_its_scan_takes_cores_others_use(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every_core: bool, others_busy: bool
) -> None:
    ingest(client, make_text(tmp_path / "etcd.txt", "Rotating the etcd certificates every year."))
    service = runtime_of(client).service.search
    recorded = Recorded(service.index, every_core)
    monkeypatch.setattr(service, "index", recorded)
    monkeypatch.setattr(service, "others", Others(others_busy))
    hits = search(client, default_dataset_id(client), "rotating certificates")
    assert [hit["fileName"] for hit in hits] == ["etcd.txt"]
    waited = recorded.times["vector began"] >= recorded.times["words found"]
    assert waited is (every_core and others_busy)
