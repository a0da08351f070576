"""Alembic environment: migrate the database named by the caller, MIXREG_DATABASE_URL or default.

SQLite connections are made by ``models_store.session.make_engine``, so migrations run inside
real ``BEGIN IMMEDIATE`` transactions (SQLite DDL is then transactional: a failed upgrade leaves
nothing half-done) and table rebuilds use Alembic's batch mode.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

import models_store.tables  # noqa: F401  (registers the tables on the metadata)
from models_store.base import Base
from models_store.migrate import MIGRATION_LOCK_KEY, include_name
from models_store.session import make_engine

DEFAULT_DATABASE_URL = "sqlite:///./mixreg.db"

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The URL set by the caller on the config, else MIXREG_DATABASE_URL, else the default."""
    return (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("MIXREG_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )


def run_migrations_offline() -> None:
    """Print the SQL of the migrations instead of running it (``alembic upgrade --sql``)."""
    url = database_url()
    context.configure(
        url=url,
        target_metadata=Base.metadata,
        include_name=include_name,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on_connection(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        # A batch rebuild drops and recreates a table; with foreign keys enforced the drop
        # would cascade (ON DELETE SET NULL) into referencing rows. The pragma only takes effect
        # outside a transaction, so it is set before ours begins; the check below replaces it.
        connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")  # type: ignore[union-attr]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        include_name=include_name,
        render_as_batch=is_sqlite,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Processes upgrading at once take turns; each later one finds the schema at head.
            # (On SQLite, BEGIN IMMEDIATE already serializes them.)
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()
        if is_sqlite:
            violations = connection.execute(text("PRAGMA foreign_key_check")).all()
            if violations:
                raise RuntimeError(f"migration broke foreign keys: {violations}")


def run_migrations_online() -> None:
    """Run the migrations against the database."""
    engine = make_engine(database_url())
    try:
        with engine.connect() as connection:
            _run_on_connection(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
