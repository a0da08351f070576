"""Registered models with versions and movable aliases (and the audit trail of every move);
datasets that can be deleted.

``registered_models`` holds a name and the highest version it gave; ``model_versions`` maps
(name, version) to one fitted model; ``model_aliases`` points an alias at a version, and
``model_alias_events`` records each move: from which version to which, when, by which API key.
A job may name the registered model its fit becomes the next version of, and ask that its
(inline) data be deleted once it is finished.

Jobs and models keep the id of the dataset they were fitted on, but no longer as a foreign
key: a dataset no unfinished job uses may be deleted, and the id stays as provenance.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(length=128)
ID = sa.String(length=32)


def upgrade() -> None:
    op.create_table(
        "registered_models",
        sa.Column("name", NAME, nullable=False),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_registered_models")),
    )
    op.create_table(
        "model_versions",
        sa.Column("registered_model", NAME, nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("model_id", ID, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["registered_model"],
            ["registered_models.name"],
            name=op.f("fk_model_versions_registered_model_registered_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_model_versions_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("registered_model", "version", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("model_id", name=op.f("uq_model_versions_model_id")),
    )
    op.create_table(
        "model_aliases",
        sa.Column("registered_model", NAME, nullable=False),
        sa.Column("alias", NAME, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", ID, nullable=True),
        sa.ForeignKeyConstraint(
            ["registered_model"],
            ["registered_models.name"],
            name=op.f("fk_model_aliases_registered_model_registered_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["registered_model", "version"],
            ["model_versions.registered_model", "model_versions.version"],
            name="fk_model_aliases_version_model_versions",
        ),
        sa.PrimaryKeyConstraint("registered_model", "alias", name=op.f("pk_model_aliases")),
    )
    op.create_table(
        "model_alias_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("registered_model", NAME, nullable=False),
        sa.Column("alias", NAME, nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=True),
        sa.Column("changed_by", ID, nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_alias_events")),
    )
    op.create_index(
        "ix_model_alias_events_registered_model",
        "model_alias_events",
        ["registered_model", "id"],
    )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("registered_model", NAME, nullable=True))
        batch_op.add_column(sa.Column("discard_data", sa.Boolean(), nullable=True))
        batch_op.drop_constraint("fk_jobs_dataset_id_datasets", type_="foreignkey")
        batch_op.create_index(batch_op.f("ix_jobs_dataset_id"), ["dataset_id"])
    with op.batch_alter_table("models") as batch_op:
        batch_op.drop_constraint("fk_models_dataset_id_datasets", type_="foreignkey")


def downgrade() -> None:
    # Rows whose dataset was deleted cannot get their foreign key back.
    op.execute("DELETE FROM models WHERE dataset_id NOT IN (SELECT id FROM datasets)")
    op.execute("DELETE FROM jobs WHERE dataset_id NOT IN (SELECT id FROM datasets)")
    with op.batch_alter_table("models") as batch_op:
        batch_op.create_foreign_key(
            "fk_models_dataset_id_datasets", "datasets", ["dataset_id"], ["id"]
        )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_dataset_id"))
        batch_op.create_foreign_key(
            "fk_jobs_dataset_id_datasets", "datasets", ["dataset_id"], ["id"]
        )
        batch_op.drop_column("discard_data")
        batch_op.drop_column("registered_model")
    op.drop_index("ix_model_alias_events_registered_model", table_name="model_alias_events")
    op.drop_table("model_alias_events")
    op.drop_table("model_aliases")
    op.drop_table("model_versions")
    op.drop_table("registered_models")
