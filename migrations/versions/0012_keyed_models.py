"""Keyed fits: a job and its model may be split by a dataset column, one mixture per key.

``jobs.split_by`` / ``models.split_by`` name the key column; ``jobs.small_keys`` says what a
key with too few rows gets; ``jobs.keys_done`` / ``jobs.n_keys`` count the keys fitted;
``jobs.keyed_summary`` and ``models.keyed_summary`` hold the per-key counts, failures and
min-loss quantiles. Every key's lines are stored in ``keyed_model_chunks``: chunks of
consecutive keys, one binary blob per chunk (docs/adr/0022-keyed-models-in-key-chunks.md),
never a row per key. A running keyed job stores each shard of keys it has fitted in
``keyed_job_shards`` (one row per (job, shard): a shard written again replaces itself), so an
attempt that takes over after a lost worker fits only the shards not stored yet.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("split_by", sa.String(), nullable=True))
        batch.add_column(sa.Column("small_keys", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("keys_done", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("n_keys", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("keyed_summary", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("keys_per_shard", sa.Integer(), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("split_by", sa.String(), nullable=True))
        batch.add_column(sa.Column("keyed_summary", sa.JSON(), nullable=True))
    op.create_table(
        "keyed_model_chunks",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_keys", sa.Integer(), nullable=False),
        sa.Column("fitted_attempt", sa.Integer(), nullable=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_keyed_model_chunks_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "position", name=op.f("pk_keyed_model_chunks")),
    )
    op.create_table(
        "keyed_job_shards",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_keys", sa.Integer(), nullable=False),
        sa.Column("fitted_attempt", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_keyed_job_shards_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "position", name=op.f("pk_keyed_job_shards")),
    )


def downgrade() -> None:
    op.drop_table("keyed_job_shards")
    op.drop_table("keyed_model_chunks")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("keyed_summary")
        batch.drop_column("split_by")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("keys_per_shard")
        batch.drop_column("keyed_summary")
        batch.drop_column("n_keys")
        batch.drop_column("keys_done")
        batch.drop_column("small_keys")
        batch.drop_column("split_by")
