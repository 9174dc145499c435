"""Alembic environment: runs the migrations on the connection that `db/migrate.py` passes in."""

from __future__ import annotations

from alembic import context

from knowledgeops.db.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `kops migrate`")
run_migrations_online()
