"""The test PostgreSQL database: this run's own, next to the one MIXREG_TEST_POSTGRES_URL names.

Each test run (each pytest-xdist process too) creates a database of its own on that server and
drops it at the end, so that two runs never empty each other's tables. Tests import these
helpers from here, never from ``conftest.py``, so that one registry of created databases exists.
"""

from __future__ import annotations

import contextlib
import os

from sqlalchemy import Connection, Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from models_store.migrate import upgrade
from tests.ci import service_unavailable

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

# (The named database of MIXREG_TEST_POSTGRES_URL, suffix) -> this run's own database next to
# it: the suffix is empty for the database of function-scoped fixtures, and names the database
# of a server shared by a module's tests, which those fixtures never empty.
_RUN_DATABASES: dict[tuple[str, str], str] = {}


def _connect(url: str, **options: object) -> tuple[Engine, Connection]:
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5}, **options)
    try:
        return engine, engine.connect()
    except OperationalError as exc:
        engine.dispose()
        where = make_url(url).render_as_string(hide_password=True)
        service_unavailable(f"PostgreSQL not reachable at {where}: {exc.orig or exc}")
        raise  # service_unavailable fails or skips the test; this is never reached


def _run_database(named_url: str, suffix: str = "") -> str:
    """The URL of this run's database (with ``suffix``, another one), created empty on first
    use."""
    if (named_url, suffix) not in _RUN_DATABASES:
        named = make_url(named_url)
        own = named.set(database=f"{named.database}_run_{os.getpid()}{suffix}")
        engine, connection = _connect(named_url, isolation_level="AUTOCOMMIT")
        with connection:
            # A leftover of an earlier run of the same process id (killed before its end).
            connection.execute(text(f'DROP DATABASE IF EXISTS "{own.database}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{own.database}"'))
        engine.dispose()
        _RUN_DATABASES[named_url, suffix] = own.render_as_string(hide_password=False)
    return _RUN_DATABASES[named_url, suffix]


def drop_run_databases() -> None:
    """Drop the databases this run created (at the end of the run)."""
    for (named_url, _), own_url in _RUN_DATABASES.items():
        with contextlib.suppress(Exception):  # a server gone by now has nothing to drop
            engine = create_engine(named_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
            with engine.connect() as connection:
                name = make_url(own_url).database
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            engine.dispose()
    _RUN_DATABASES.clear()


def _tables(connection: Connection) -> list[str]:
    """The tables of the ``public`` schema, by name."""
    query = text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
    return list(connection.execute(query).scalars())


def _revision(connection: Connection, tables: list[str]) -> str | None:
    if "alembic_version" not in tables:
        return None
    revision: str | None = connection.execute(
        text("SELECT version_num FROM alembic_version")
    ).scalar()
    return revision


# The tables of this run's database right after a migration to head, once it was migrated.
_MIGRATED_TABLES: list[str] = []


def migrated_postgres_database(head: str) -> str:
    """Return the URL of this run's PostgreSQL database at revision ``head`` with every table
    empty.

    Migrating takes a second or more, emptying the tables a fraction of that: when the database
    is still at ``head`` with the very tables a migration to it made (the previous test left
    it so), its tables are emptied, else it is rebuilt from an empty schema.
    """
    url = _run_database(os.environ.get("MIXREG_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL))
    engine, connection = _connect(url)
    try:
        with connection, connection.begin():
            connection.execute(text("SET LOCAL lock_timeout = '10s'"))
            tables = _tables(connection)
            if (
                _MIGRATED_TABLES
                and tables == _MIGRATED_TABLES
                and _revision(connection, tables) == head
            ):
                names = ", ".join(f'"{name}"' for name in tables if name != "alembic_version")
                connection.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
                return url
    finally:
        engine.dispose()
    empty_postgres_database()
    upgrade(url)
    engine, connection = _connect(url)
    with connection:
        _MIGRATED_TABLES[:] = _tables(connection)
    engine.dispose()
    return url


def empty_postgres_database(suffix: str = "") -> str:
    """Empty the ``public`` schema of this run's PostgreSQL database (with ``suffix``, of
    another database of this run's) and return its URL (for fixtures of a wider scope than
    ``postgres_url``'s)."""
    url = _run_database(
        os.environ.get("MIXREG_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL), suffix
    )
    engine, connection = _connect(url)
    try:
        with connection, connection.begin():
            # Fail fast rather than hang if a leaked connection still holds a lock.
            connection.execute(text("SET LOCAL lock_timeout = '10s'"))
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()
    return url
