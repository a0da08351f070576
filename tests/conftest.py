"""Shared database fixtures: a fresh SQLite file or a freshly reset PostgreSQL schema per test.

PostgreSQL is named by MIXREG_TEST_POSTGRES_URL. When it cannot be reached the PostgreSQL
variant of a test is skipped on a developer machine, but fails in CI (CI set to 1, true, yes
or on, see tests/ci.py), where the server is part of the environment. Each test run works in
a database of its own, created on that server next to the named one and dropped at the end,
so that two runs (two checkouts, say) never empty each other's tables.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, make_url, text
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

# A test's record_property(REPORT_PROPERTY, text) is printed at the end of the run: the way a
# test shows figures (fuzzing counts, load tables) that survives output capture and xdist.
REPORT_PROPERTY = "report"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a new, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'mixreg.db'}"


@pytest.fixture
def postgres_url() -> str:
    """URL of the test PostgreSQL database with an empty ``public`` schema."""
    return empty_postgres_database()


# The named database of MIXREG_TEST_POSTGRES_URL -> this run's own database next to it.
_RUN_DATABASES: dict[str, str] = {}


def _connect(url: str, **options: object) -> tuple[Engine, Connection]:
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5}, **options)
    try:
        return engine, engine.connect()
    except OperationalError as exc:
        engine.dispose()
        where = make_url(url).render_as_string(hide_password=True)
        service_unavailable(f"PostgreSQL not reachable at {where}: {exc.orig or exc}")
        raise  # service_unavailable fails or skips the test; this is never reached


def _run_database(named_url: str) -> str:
    """The URL of this run's database, created (empty) on first use."""
    if named_url not in _RUN_DATABASES:
        named = make_url(named_url)
        own = named.set(database=f"{named.database}_run_{os.getpid()}")
        engine, connection = _connect(named_url, isolation_level="AUTOCOMMIT")
        with connection:
            # A leftover of an earlier run of the same process id (killed before its end).
            connection.execute(text(f'DROP DATABASE IF EXISTS "{own.database}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{own.database}"'))
        engine.dispose()
        _RUN_DATABASES[named_url] = own.render_as_string(hide_password=False)
    return _RUN_DATABASES[named_url]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the databases this run created."""
    for named_url, own_url in _RUN_DATABASES.items():
        with contextlib.suppress(Exception):
            engine = create_engine(named_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
            with engine.connect() as connection:
                name = make_url(own_url).database
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            engine.dispose()
    _RUN_DATABASES.clear()


def empty_postgres_database() -> str:
    """Empty the ``public`` schema of this run's PostgreSQL database and return its URL (for
    fixtures of a wider scope than ``postgres_url``'s)."""
    url = _run_database(os.environ.get("MIXREG_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL))
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what tests recorded under REPORT_PROPERTY, in the order they ran."""
    reports = [
        report
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", None) == "call"
    ]
    lines = [
        f"{report.nodeid}\n{value}"
        for report in sorted(reports, key=lambda report: report.nodeid)
        for name, value in report.user_properties
        if name == REPORT_PROPERTY
    ]
    if lines:
        terminalreporter.section("reports")
        for line in lines:
            terminalreporter.write_line(line)
