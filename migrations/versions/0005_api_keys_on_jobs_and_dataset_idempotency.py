"""API keys and idempotent uploads: the key that submitted each job (for its limit of
unfinished jobs), and an ``Idempotency-Key`` with the hash of its upload on datasets.

The new columns are nullable: jobs submitted before, or without keys, belong to no key, and
datasets uploaded before have no idempotency key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("api_key_id", sa.String(length=32), nullable=True))
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=128), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_datasets_idempotency_key"), ["idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_datasets_idempotency_key"), type_="unique")
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("api_key_id")
