"""Shared database fixtures: a fresh SQLite file or a freshly reset PostgreSQL schema per test,
empty or at the newest migration.

A migrated database is a copy of a SQLite file migrated once per process, or this run's
PostgreSQL database with its tables emptied, since migrating anew takes a second or more.

PostgreSQL is named by MIXREG_TEST_POSTGRES_URL. When it cannot be reached the PostgreSQL
variant of a test is skipped on a developer machine, but fails in CI (CI set to 1, true, yes
or on, see tests/ci.py), where the server is part of the environment. Each test run works in
a database of its own, created on that server next to the named one and dropped at the end,
so that two runs (two checkouts, say) never empty each other's tables.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from models_store.migrate import head_revision, upgrade
from models_store.session import make_engine, make_sessionmaker
from tests.postgres import drop_run_databases, empty_postgres_database, migrated_postgres_database
from tests.reporting import REPORT_PROPERTY

# pytester runs pytest inside a test, to check what the fixtures below do to the tests that use
# them; leftover_processes fails the run when a process it started outlives it.
pytest_plugins = ["pytester", "tests.leftover_processes"]


_BACKEND_FIXTURES = {"sqlite": "sqlite_url", "postgresql": "postgres_url"}


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a new, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'mixreg.db'}"


@pytest.fixture
def postgres_url() -> str:
    """URL of the test PostgreSQL database with an empty ``public`` schema."""
    return empty_postgres_database()


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per process (copying it takes a millisecond,
    migrating a new file a second or more)."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    upgrade(f"sqlite:///{path}")
    return path


def _migrated(backend: str, request: pytest.FixtureRequest) -> str:
    """URL of a database at the newest migration with every table empty."""
    if backend == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
        path = make_url(url).database
        assert path is not None and not Path(path).exists()
        shutil.copyfile(request.getfixturevalue("migrated_sqlite_template"), path)
        return url
    return migrated_postgres_database(head_revision())


@pytest.fixture
def migrated_sqlite_url(request: pytest.FixtureRequest) -> str:
    """URL of a new SQLite file at the newest migration with every table empty (a copy of the
    file migrated once per process)."""
    return _migrated("sqlite", request)


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest) -> str:
    """URL of an empty database, once on SQLite and once on PostgreSQL (already migrated when
    the test uses ``migrated_database_url``, which is the same database)."""
    if "migrated_database_url" in request.fixturenames:
        # Built at head directly: emptying the database first would undo the work.
        return _migrated(request.param, request)
    url: str = request.getfixturevalue(_BACKEND_FIXTURES[request.param])
    return url


@pytest.fixture
def migrated_database_url(database_url: str, request: pytest.FixtureRequest) -> str:
    """URL of a database at the newest migration with every table empty: a copy of a file
    migrated once on SQLite, this run's database emptied on PostgreSQL."""
    if "migrated_database_url" not in request.fixturenames:  # asked for by getfixturevalue
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    drop_run_databases()


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
