"""The prediction log, its sampling settings and realised outcomes.

``prediction_log_settings`` holds the share of predictions logged per model id or
``name@alias``; ``prediction_log`` one row per logged row of a predict request (request id,
row, model, version, alias, key, features and the k values); ``prediction_outcomes`` the
realised targets joined to them with their errors (docs/adr/0032-prediction-log-and-outcomes.md).

Revision ID: 0032
Revises: 0016
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "prediction_log_settings",
        sa.Column("target", sa.String(length=257), nullable=False),
        sa.Column("sample_rate", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("target", name=op.f("pk_prediction_log_settings")),
    )
    op.create_table(
        "prediction_log",
        sa.Column("id", _ROW_ID, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("logged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("registered_model", sa.String(length=128), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("alias", sa.String(length=128), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("features", sa.LargeBinary(), nullable=False),
        sa.Column("predictions", sa.LargeBinary(), nullable=False),
        sa.Column("most_likely_component", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prediction_log")),
        sa.UniqueConstraint("request_id", "row_index", name="uq_prediction_log_request_id_row"),
    )
    op.create_index("ix_prediction_log_logged_at", "prediction_log", ["logged_at", "id"])
    op.create_table(
        "prediction_outcomes",
        sa.Column("id", _ROW_ID, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("registered_model", sa.String(length=128), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("alias", sa.String(length=128), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("predicted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("predicted_hour", sa.Integer(), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("y", sa.Double(), nullable=False),
        sa.Column("min_loss", sa.Double(), nullable=False),
        sa.Column("best_component", sa.Integer(), nullable=False),
        sa.Column("n_components", sa.Integer(), nullable=False),
        sa.Column("most_likely_loss", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prediction_outcomes")),
        sa.UniqueConstraint(
            "request_id", "row_index", name="uq_prediction_outcomes_request_id_row"
        ),
    )
    op.create_index(
        "ix_prediction_outcomes_model_id_hour",
        "prediction_outcomes",
        ["model_id", "predicted_hour"],
    )
    op.create_index(
        "ix_prediction_outcomes_registered_model_hour",
        "prediction_outcomes",
        ["registered_model", "predicted_hour"],
    )
    op.create_index(
        "ix_prediction_outcomes_observed_at", "prediction_outcomes", ["observed_at", "id"]
    )


def downgrade() -> None:
    op.drop_table("prediction_outcomes")
    op.drop_table("prediction_log")
    op.drop_table("prediction_log_settings")
