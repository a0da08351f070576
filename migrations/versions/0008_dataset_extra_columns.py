"""Datasets keep extra columns beside the features and the target.

``datasets.extra_columns`` lists each kept column's name and type (``number`` or ``string``);
``dataset_chunks.extra_data`` holds a chunk's values of those columns as one Arrow IPC stream
(docs/adr/0018-extra-columns-as-arrow-ipc-per-chunk.md). Datasets stored before this revision
have no extra columns and chunks without extra data.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Two batches: on SQLite the first adds the column in place, giving every stored dataset an
    # empty list; the second rebuilds the table without the default (new rows get theirs from
    # the application, as the other JSON lists do).
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(
            sa.Column("extra_columns", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
    with op.batch_alter_table("datasets") as batch:
        batch.alter_column("extra_columns", existing_type=sa.JSON(), server_default=None)
    with op.batch_alter_table("dataset_chunks") as batch:
        batch.add_column(sa.Column("extra_data", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dataset_chunks") as batch:
        batch.drop_column("extra_data")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("extra_columns")
