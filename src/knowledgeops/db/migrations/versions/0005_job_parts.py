"""job parts: a large PDF split into page-range part jobs

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(length=36), nullable=True))
        batch.create_foreign_key(
            op.f("fk_ingest_jobs_parent_id_ingest_jobs"),
            "ingest_jobs",
            ["parent_id"],
            ["id"],
            ondelete="CASCADE",
        )
        batch.create_index(op.f("ix_ingest_jobs_parent_id"), ["parent_id"], unique=False)
    op.create_table(
        "job_parts",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("part_index", sa.Integer(), nullable=False),
        sa.Column("first_page", sa.Integer(), nullable=False),
        sa.Column("last_page", sa.Integer(), nullable=False),
        sa.Column("ordinal_base", sa.Integer(), nullable=False),
        sa.Column("max_chunks", sa.Integer(), nullable=False),
        sa.Column("chunk_size", sa.Integer(), nullable=False),
        sa.Column("chunk_overlap", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["ingest_jobs.id"],
            name=op.f("fk_job_parts_job_id_ingest_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_parts")),
    )


def downgrade() -> None:
    op.drop_table("job_parts")
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.drop_index(op.f("ix_ingest_jobs_parent_id"))
        batch.drop_constraint(op.f("fk_ingest_jobs_parent_id_ingest_jobs"), type_="foreignkey")
        batch.drop_column("parent_id")
