"""Gated mixtures: a fit may ask for a gate, and a model may have one.

``jobs.gating`` is null (no gate), ``"features"`` or the list of the dataset's extra number
columns the gate reads; ``models.gate`` is null or the fitted gate (coefficients, intercepts,
noise variances, log-likelihood, BIC, holdout metrics). Jobs and models stored before this
revision have no gate.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gating", sa.JSON(), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("gate", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("gate")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gating")
