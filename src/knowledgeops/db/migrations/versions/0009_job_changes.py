"""The record of job changes that event streams follow: job_events rows of kind `change`

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("dataset_id", sa.String(length=36)),
    ("document_id", sa.String(length=36)),
    ("status", sa.String(length=20)),
    ("total", sa.Integer()),
    ("processed", sa.Integer()),
    ("attempt", sa.Integer()),
    ("max_attempts", sa.Integer()),
    ("error", sa.Text()),
    ("retryable", sa.Boolean()),
)


def upgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))
    op.create_index(op.f("ix_job_events_job_id_id"), "job_events", ["job_id", "id"], unique=False)
    op.create_index(
        op.f("ix_job_events_dataset_id_id"), "job_events", ["dataset_id", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_job_events_dataset_id_id"), table_name="job_events")
    op.drop_index(op.f("ix_job_events_job_id_id"), table_name="job_events")
    with op.batch_alter_table("job_events") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
