"""re-embed a dataset: the model of each document's searchable generation; dataset-wide jobs

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 16:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        batch.add_column(sa.Column("embedding_model", sa.String(length=200), nullable=True))
        batch.create_index(
            op.f("ix_documents_dataset_id_embedding_model"),
            ["dataset_id", "embedding_model"],
            unique=False,
        )
    # every searchable generation so far was embedded by its dataset's model (a dataset could
    # not change its model before this revision)
    op.execute(
        "UPDATE documents SET embedding_model = (SELECT datasets.embedding_model FROM datasets "
        "WHERE datasets.id = documents.dataset_id) WHERE active_generation IS NOT NULL"
    )
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.alter_column("document_id", existing_type=sa.String(length=36), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM ingest_jobs WHERE document_id IS NULL")
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.alter_column("document_id", existing_type=sa.String(length=36), nullable=False)
    with op.batch_alter_table("documents") as batch:
        batch.drop_index(op.f("ix_documents_dataset_id_embedding_model"))
        batch.drop_column("embedding_model")
