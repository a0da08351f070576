"""Engines, session factories and the unit-of-work scope."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_S = 30

# NaN and infinity are not JSON; refuse them at write time instead of storing text that a
# strict reader (PostgreSQL, any JSON client) rejects later.
_json_serializer = functools.partial(json.dumps, allow_nan=False)


def _configure_sqlite_connection(dbapi_connection: Any, connection_record: Any) -> None:
    # Take BEGIN away from the sqlite3 driver (it would defer it to the first write, so two
    # transactions could read the same row and then collide); _begin_immediate emits our own.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


READ_ONLY = "mixreg_read_only"
"""Execution option of a connection whose transactions only read (see :func:`read_scope`)."""


def _begin(connection: Connection) -> None:
    if connection.get_execution_options().get(READ_ONLY):
        # A deferred transaction takes no lock until it writes; under WAL it reads a snapshot
        # while a writer goes on, so reads never queue behind writes or behind each other.
        connection.exec_driver_sql("BEGIN")
        return
    # A write transaction takes the write lock when it starts: concurrent writers then wait in
    # busy_timeout instead of failing with "database is locked" on a read-to-write upgrade.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """Build an engine for ``url``, configured for safe use from several processes.

    SQLite gets WAL, a busy timeout, foreign keys, ``BEGIN IMMEDIATE`` write transactions and
    deferred read transactions (:func:`read_scope`); PostgreSQL gets pre-ping so connections
    dropped by the server are replaced.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
            json_serializer=_json_serializer,
        )
        event.listen(engine, "connect", _configure_sqlite_connection)
        event.listen(engine, "begin", _begin)
        return engine
    return create_engine(parsed, pool_pre_ping=True, json_serializer=_json_serializer)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Return a session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(session_factory: sessionmaker[Session]) -> Iterator[Session]:
    """Run one unit of work: commit if the block succeeds, roll back if it raises."""
    with session_factory.begin() as session:
        yield session


@contextmanager
def read_scope(session_factory: sessionmaker[Session]) -> Iterator[Session]:
    """Read in one transaction that takes no write lock (SQLite: a deferred ``BEGIN`` reading a
    WAL snapshot), so it neither waits for a writer nor makes one wait.

    For reads only: on SQLite a write in it could not upgrade while another writer commits.
    Objects read stay readable after the block, as with :func:`session_scope`.
    """
    with session_factory.begin() as session:
        session.connection(execution_options={READ_ONLY: True})
        yield session
