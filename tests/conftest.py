"""Shared database fixtures: a fresh SQLite file or a freshly reset PostgreSQL schema per test.

PostgreSQL is named by MIXREG_TEST_POSTGRES_URL. When it cannot be reached the PostgreSQL
variant of a test is skipped on a developer machine, but fails in CI (CI set to 1, true, yes
or on, see tests/ci.py), where the server is part of the environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from models_store.migrate import upgrade
from models_store.session import make_engine, make_sessionmaker
from tests.ci import service_unavailable

# Runs pytest inside a test, to check what the fixtures below do to the tests that use them.
pytest_plugins = ["pytester"]

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

_BACKEND_FIXTURES = {"sqlite": "sqlite_url", "postgresql": "postgres_url"}


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a new, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'mixreg.db'}"


@pytest.fixture
def postgres_url() -> str:
    """URL of the test PostgreSQL database with an empty ``public`` schema."""
    return empty_postgres_database()


def empty_postgres_database() -> str:
    """Empty the ``public`` schema of the test PostgreSQL database and return its URL (for
    fixtures of a wider scope than ``postgres_url``'s)."""
    url = os.environ.get("MIXREG_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL)
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        try:
            connection = engine.connect()
        except OperationalError as exc:
            where = make_url(url).render_as_string(hide_password=True)
            service_unavailable(f"PostgreSQL not reachable at {where}: {exc.orig or exc}")
        with connection, connection.begin():
            # Fail fast rather than hang if a leaked connection still holds a lock.
            connection.execute(text("SET LOCAL lock_timeout = '10s'"))
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()
    return url


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest) -> str:
    """URL of an empty database, once on SQLite and once on PostgreSQL."""
    url: str = request.getfixturevalue(_BACKEND_FIXTURES[request.param])
    return url


@pytest.fixture
def migrated_database_url(database_url: str) -> str:
    """URL of a database built by running the migrations up to head."""
    upgrade(database_url)
    return database_url


@pytest.fixture
def db_engine(migrated_database_url: str) -> Iterator[Engine]:
    """An application engine on the migrated database."""
    engine = make_engine(migrated_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def db_sessionmaker(db_engine: Engine) -> sessionmaker[Session]:
    """A session factory on the migrated database, for use with ``session_scope``."""
    return make_sessionmaker(db_engine)
