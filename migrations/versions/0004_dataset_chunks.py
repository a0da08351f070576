"""Datasets in row chunks: their values move from ``datasets.x_data``/``y_data`` to
``dataset_chunks`` (docs/adr/0009-datasets-in-row-chunks.md).

The upgrade copies every existing dataset into one chunk inside the database (a single
``INSERT … SELECT``, nothing passes through Python), then drops the old columns. The downgrade
joins each dataset's chunks back into one value, one dataset at a time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_chunks",
        sa.Column("dataset_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("x_data", sa.LargeBinary(), nullable=False),
        sa.Column("y_data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_dataset_chunks_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dataset_id", "position", name=op.f("pk_dataset_chunks")),
    )
    op.execute(
        "INSERT INTO dataset_chunks (dataset_id, position, n_rows, x_data, y_data) "
        "SELECT id, 0, n_rows, x_data, y_data FROM datasets"
    )
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.drop_column("y_data")
        batch_op.drop_column("x_data")


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.add_column(sa.Column("x_data", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("y_data", sa.LargeBinary(), nullable=True))
    if not op.get_context().as_sql:
        _join_chunks(op.get_bind())
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.alter_column("x_data", existing_type=sa.LargeBinary(), nullable=False)
        batch_op.alter_column("y_data", existing_type=sa.LargeBinary(), nullable=False)
    op.drop_table("dataset_chunks")


def _join_chunks(connection: sa.Connection) -> None:
    """Write each dataset's chunks, in order, into its own ``x_data`` and ``y_data``."""
    chunks = sa.table(
        "dataset_chunks",
        sa.column("dataset_id", sa.String()),
        sa.column("position", sa.Integer()),
        sa.column("x_data", sa.LargeBinary()),
        sa.column("y_data", sa.LargeBinary()),
    )
    datasets = sa.table(
        "datasets",
        sa.column("id", sa.String()),
        sa.column("x_data", sa.LargeBinary()),
        sa.column("y_data", sa.LargeBinary()),
    )
    dataset_ids = connection.scalars(sa.select(datasets.c.id)).all()
    for dataset_id in dataset_ids:
        x_parts: list[bytes] = []
        y_parts: list[bytes] = []
        rows = connection.execute(
            sa.select(chunks.c.x_data, chunks.c.y_data)
            .where(chunks.c.dataset_id == dataset_id)
            .order_by(chunks.c.position)
        )
        for x_data, y_data in rows:
            x_parts.append(bytes(x_data))
            y_parts.append(bytes(y_data))
        connection.execute(
            sa.update(datasets)
            .where(datasets.c.id == dataset_id)
            .values(x_data=b"".join(x_parts), y_data=b"".join(y_parts))
        )
