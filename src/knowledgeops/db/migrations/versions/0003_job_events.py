"""job events and stage start times, for metrics

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 11:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("stage", sa.String(length=20), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=True),
        sa.Column("code", sa.String(length=64), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index(
        op.f("ix_job_events_kind_category"), "job_events", ["kind", "category"], unique=False
    )
    op.create_index(op.f("ix_job_events_kind_stage"), "job_events", ["kind", "stage"], unique=False)
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.add_column(sa.Column("stage_started_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.drop_column("stage_started_at")
    op.drop_index(op.f("ix_job_events_kind_stage"), table_name="job_events")
    op.drop_index(op.f("ix_job_events_kind_category"), table_name="job_events")
    op.drop_table("job_events")
