"""The local PostgreSQL helper refuses clearly what cannot work, before running initdb."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knowledgeops.lab.devpg import LocalPostgres, LocalPostgresError


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to the postgres user")
def test_a_data_folder_the_postgres_user_cannot_reach_is_named(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    server = LocalPostgres(private / "pg", port=1)
    with pytest.raises(LocalPostgresError, match=r"postgres user cannot enter .*private"):
        server.init()
    assert not server.initialised()
