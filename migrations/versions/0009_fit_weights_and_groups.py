"""Fits with sample weights and grouped rows: the columns they used, and each grouped model's
group -> line table.

Jobs and models name the dataset column of the row weights (``weights_column``) and of the
group labels (``groups_column``). A grouped model keeps the line of every training group in
``group_table``: one compressed ``.npz`` (labels and lines as two numpy arrays, no pickle), a
few bytes per group however many groups (up to 10^6), never a JSON row per group. Its
group-level metrics go to ``group_metrics``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMN_NAME = sa.String()


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("weights_column", COLUMN_NAME, nullable=True))
        batch.add_column(sa.Column("groups_column", COLUMN_NAME, nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("weights_column", COLUMN_NAME, nullable=True))
        batch.add_column(sa.Column("groups_column", COLUMN_NAME, nullable=True))
        batch.add_column(sa.Column("group_table", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("group_metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("group_metrics")
        batch.drop_column("group_table")
        batch.drop_column("groups_column")
        batch.drop_column("weights_column")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("groups_column")
        batch.drop_column("weights_column")
