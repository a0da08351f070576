"""k sweeps and fit diagnostics: a job's k values, sweep result and warnings; a model's
search record, warnings, convergence and BIC.

Rows stored before this revision keep working: the new columns are nullable, except the
warning lists, which are filled with empty lists (through a server default that is dropped
again: the application always writes them, and PostgreSQL cannot compare JSON defaults).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EMPTY_JSON_LIST = sa.text("'[]'")


def upgrade() -> None:
    # Two batches each: on SQLite the first adds the columns in place, the second rebuilds the
    # table without the default once every row has its value.
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("k_values", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("progress_n_components", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sweep", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("warnings", sa.JSON(), server_default=EMPTY_JSON_LIST, nullable=False)
        )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.alter_column("warnings", existing_type=sa.JSON(), server_default=None)
    with op.batch_alter_table("models") as batch_op:
        batch_op.add_column(sa.Column("converged", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("log_likelihood", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("bic", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("n_parameters", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("candidates", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("warnings", sa.JSON(), server_default=EMPTY_JSON_LIST, nullable=False)
        )
    with op.batch_alter_table("models") as batch_op:
        batch_op.alter_column("warnings", existing_type=sa.JSON(), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("models") as batch_op:
        batch_op.drop_column("warnings")
        batch_op.drop_column("candidates")
        batch_op.drop_column("n_parameters")
        batch_op.drop_column("bic")
        batch_op.drop_column("log_likelihood")
        batch_op.drop_column("converged")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("warnings")
        batch_op.drop_column("sweep")
        batch_op.drop_column("progress_n_components")
        batch_op.drop_column("k_values")
