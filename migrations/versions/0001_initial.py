"""Initial schema: datasets, jobs and fitted models.

Revision ID: 0001
Revises:
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("n_features", sa.Integer(), nullable=False),
        sa.Column("feature_names", sa.JSON(), nullable=False),
        sa.Column("target_name", sa.String(), nullable=True),
        sa.Column("x_data", sa.LargeBinary(), nullable=False),
        sa.Column("y_data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("algorithm", sa.String(length=64), nullable=False),
        sa.Column("n_components", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("fit_intercept", sa.Boolean(), nullable=False),
        sa.Column("holdout_fraction", sa.Double(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("time_budget_s", sa.Double(), nullable=True),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("request_hash", sa.String(length=128), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("progress_fraction", sa.Double(), nullable=False),
        sa.Column("progress_iteration", sa.Integer(), nullable=True),
        sa.Column("progress_candidates", sa.Integer(), nullable=True),
        sa.Column("progress_best_loss", sa.Double(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker_id", sa.String(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("model_id", sa.String(length=32), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_jobs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_jobs_dataset_id_datasets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_jobs_idempotency_key")),
    )
    op.create_index(op.f("ix_jobs_status"), "jobs", ["status"], unique=False)
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("algorithm", sa.String(length=64), nullable=False),
        sa.Column("n_components", sa.Integer(), nullable=False),
        sa.Column("n_features", sa.Integer(), nullable=False),
        sa.Column("feature_names", sa.JSON(), nullable=False),
        sa.Column("fit_intercept", sa.Boolean(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("coef", sa.JSON(), nullable=False),
        sa.Column("intercept", sa.JSON(), nullable=False),
        sa.Column("shares", sa.JSON(), nullable=False),
        sa.Column("train_min_loss", sa.Double(), nullable=False),
        sa.Column("holdout_min_loss", sa.Double(), nullable=True),
        sa.Column("baseline", sa.JSON(), nullable=False),
        sa.Column("n_train", sa.Integer(), nullable=False),
        sa.Column("n_holdout", sa.Integer(), nullable=False),
        sa.Column("loss_history", sa.JSON(), nullable=False),
        sa.Column("n_iter", sa.Integer(), nullable=False),
        sa.Column("fit_seconds", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_models_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_models_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
    )


def downgrade() -> None:
    op.drop_table("models")
    op.drop_index(op.f("ix_jobs_status"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("datasets")
