"""The scale-out queue: Procrastinate's schema (PostgreSQL only) and a job's task id.

On PostgreSQL this installs the schema of the pinned Procrastinate version (its tables, types,
functions and triggers, all named ``procrastinate_*``) in the same transaction as the rest of
the upgrade, so one ``mixreg db upgrade`` sets up everything a ``mixreg worker`` needs. On
SQLite, which Procrastinate does not support, that part does nothing.

On every backend ``jobs.task_id`` records the Procrastinate job that carries a fit job (null
for jobs run by the embedded worker), so a cancellation reaches the right task.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from procrastinate.schema import SchemaManager

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Drops every object of Procrastinate's schema, found by its name prefix in the current schema:
# tables (with their triggers, indexes and sequences), then functions, then types.
DROP_PROCRASTINATE_SCHEMA = r"""
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind = 'r'
          AND c.relname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', item.relname);
    END LOOP;
    FOR item IN
        SELECT p.oid::regprocedure AS signature
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND p.proname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', item.signature);
    END LOOP;
    FOR item IN
        SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = current_schema() AND t.typtype IN ('e', 'c')
          AND t.typname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', item.typname);
    END LOOP;
END
$$;
"""


def _is_postgresql() -> bool:
    return op.get_context().dialect.name == "postgresql"


def _execute_script(script: str) -> None:
    """Run a multi-statement SQL script as it is: no bind parameters, '%' and ':' literal."""
    if op.get_context().as_sql:
        op.execute(script)
        return
    op.get_bind().exec_driver_sql(script, execution_options={"no_parameters": True})


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("task_id", sa.BigInteger(), nullable=True))
    if _is_postgresql():
        _execute_script(SchemaManager.get_schema())


def downgrade() -> None:
    if _is_postgresql():
        _execute_script(DROP_PROCRASTINATE_SCHEMA)
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("task_id")
