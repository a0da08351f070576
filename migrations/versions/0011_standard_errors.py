"""Standard errors: what a job asked for, and the table of estimates a model carries.

``jobs.uncertainty`` holds the request (``standard_errors``, ``n_bootstrap``, ``bootstrap``);
``models.uncertainty`` the per-line table of estimates, standard errors, z values, p values
and intervals (and the bootstrap's). Both are JSON, null for rows stored before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("uncertainty", sa.JSON(), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("uncertainty", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("uncertainty")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("uncertainty")
