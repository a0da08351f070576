"""Idempotency keys per caller: an ``Idempotency-Key`` is unique within the API key that sent
it (callers without a key share one scope), on jobs and on datasets.

Rows stored before keep their keys: a job's scope is the API key that submitted it (the shared
scope without one), a dataset's the shared scope (its uploader was not recorded).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHARED_SCOPE = ""
"""The scope of callers without an API key (``service.auth`` has no key id that is empty)."""


def upgrade() -> None:
    for table in ("jobs", "datasets"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("idempotency_scope", sa.String(32), nullable=True))
    op.execute(
        sa.text(
            "UPDATE jobs SET idempotency_scope = COALESCE(api_key_id, :shared) "
            "WHERE idempotency_key IS NOT NULL"
        ).bindparams(shared=SHARED_SCOPE)
    )
    op.execute(
        sa.text(
            "UPDATE datasets SET idempotency_scope = :shared WHERE idempotency_key IS NOT NULL"
        ).bindparams(shared=SHARED_SCOPE)
    )
    for table in ("jobs", "datasets"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_constraint(f"uq_{table}_idempotency_key", type_="unique")
            batch_op.create_unique_constraint(
                f"uq_{table}_idempotency_scope_key", ["idempotency_scope", "idempotency_key"]
            )


def downgrade() -> None:
    # Keys that only their scope told apart cannot all stay: the oldest row keeps its key.
    for table in ("jobs", "datasets"):
        op.execute(
            sa.text(
                f"UPDATE {table} SET idempotency_key = NULL WHERE idempotency_key IS NOT NULL "
                f"AND EXISTS (SELECT 1 FROM {table} AS earlier "
                f"WHERE earlier.idempotency_key = {table}.idempotency_key "
                f"AND (earlier.created_at < {table}.created_at OR "
                f"(earlier.created_at = {table}.created_at AND earlier.id < {table}.id)))"
            )
        )
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_constraint(f"uq_{table}_idempotency_scope_key", type_="unique")
            batch_op.create_unique_constraint(f"uq_{table}_idempotency_key", ["idempotency_key"])
            batch_op.drop_column("idempotency_scope")
