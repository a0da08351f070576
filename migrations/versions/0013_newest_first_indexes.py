"""Indexes on (created_at, id) of datasets, jobs and models.

Every list is newest first, ordered by ``created_at`` then ``id`` (the keyset of its cursor).
Without an index each page scanned and sorted the whole table, whole rows and all: a
``GET /jobs?limit=20`` cost grew with every job ever submitted. With it, a page reads its rows
from the end of the index.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("datasets", "jobs", "models")


def upgrade() -> None:
    for table in TABLES:
        op.create_index(f"ix_{table}_created_at_id", table, ["created_at", "id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_created_at_id", table_name=table)
