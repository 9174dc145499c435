"""The relay's leader lock on a real PostgreSQL: one holder at a time, and a standby takes over
as soon as the holder's session ends (its process died or lost the network)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from knowledgeops.db.engine import Database
from knowledgeops.jobs.leader import AdvisoryLeader
from tests.conftest import wait_for

pytestmark = pytest.mark.postgres


def test_only_one_relay_leads_and_a_release_hands_over(postgres_db: Database) -> None:
    first, second = AdvisoryLeader(postgres_db.url), AdvisoryLeader(postgres_db.url)
    try:
        assert first.try_acquire()
        assert not second.try_acquire()
        assert first.try_acquire()  # still the leader: idempotent
        first.release()
        assert not first.is_leader
        assert second.try_acquire()
        assert not first.try_acquire()
    finally:
        first.release()
        second.release()


def test_a_dead_leader_session_frees_the_lock_and_the_old_leader_steps_down(
    postgres_db: Database,
) -> None:
    leader, standby = AdvisoryLeader(postgres_db.url), AdvisoryLeader(postgres_db.url)
    try:
        assert leader.try_acquire()
        assert not standby.try_acquire()
        assert leader._conn is not None
        pid = leader._conn.info.backend_pid
        admin = create_engine(postgres_db.url)
        with admin.connect() as conn:  # the leader's connection drops, as when it is killed
            killed = conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).all()
        admin.dispose()
        assert killed == [(True,)]
        # pg_terminate_backend only signals: the backend exits, and frees the lock, a moment later
        assert wait_for(standby.try_acquire, timeout=10, what="the standby taking the lock")
        assert not leader.still_leader()
        assert not leader.is_leader
        assert not leader.try_acquire()
    finally:
        leader.release()
        standby.release()


def test_a_standby_asks_again_on_the_session_it_keeps(postgres_db: Database) -> None:
    leader, standby = AdvisoryLeader(postgres_db.url), AdvisoryLeader(postgres_db.url)
    try:
        assert leader.try_acquire()
        assert not standby.try_acquire()
        session = standby._conn
        assert session is not None
        for _ in range(3):
            assert not standby.try_acquire()
        assert standby._conn is session  # no reconnect per try
        leader.release()
        assert standby.try_acquire()
        assert standby._conn is session
    finally:
        leader.release()
        standby.release()


def test_leader_election_refuses_sqlite(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        AdvisoryLeader(f"sqlite:///{tmp_path}/kops.db")
