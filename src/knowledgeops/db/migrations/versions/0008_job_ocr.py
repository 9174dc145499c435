"""OCR progress and low-confidence pages of a job; the OCR languages of a dataset

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 19:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_ocr",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("pages_done", sa.Integer(), nullable=False),
        sa.Column("pages_total", sa.Integer(), nullable=False),
        sa.Column("low_confidence_pages", sa.JSON(), nullable=False),
        sa.Column("page_confidences", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["ingest_jobs.id"],
            name=op.f("fk_job_ocr_job_id_ingest_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_ocr")),
    )
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(
            sa.Column("ocr_languages", sa.JSON(), nullable=False, server_default='["en", "zh"]')
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("ocr_languages")
    op.drop_table("job_ocr")
