"""Keyed jobs fitted by several workers: a claim row per shard of keys.

A keyed job plans its shards once (``keyed_job_shard_claims``: the shard's key count and the
dataset rows of its keys) and every worker may then fit a shard it claims: a claim names its
claimant and carries a heartbeat on the database's clock, so the shard of a claimant that
died is claimed again once the heartbeat is older than ``MIXREG_STALE_AFTER_S``; ``done``
says the shard is stored. ``keyed_job_shards.fitted_by`` and ``keyed_model_chunks.fitted_by``
name the worker that fitted the shard (docs/adr/0027-keyed-shards-over-several-workers.md).

Revision ID: 0016
Revises: 0013
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "keyed_job_shard_claims",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_keys", sa.Integer(), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("rows", sa.LargeBinary(), nullable=False),
        sa.Column("claimed_by", sa.String(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("keys_done", sa.Integer(), nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_keyed_job_shard_claims_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "position", name=op.f("pk_keyed_job_shard_claims")),
    )
    for table in ("keyed_job_shards", "keyed_model_chunks"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("fitted_by", sa.String(), nullable=True))


def downgrade() -> None:
    for table in ("keyed_model_chunks", "keyed_job_shards"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("fitted_by")
    op.drop_table("keyed_job_shard_claims")
