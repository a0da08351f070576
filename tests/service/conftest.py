"""An in-process app (FastAPI's TestClient) on a migrated database, and row counting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store.session import session_scope
from models_store.tables import Dataset, Job, Model
from service.config import Settings
from service.jobs.training import run_job
from service.main import create_app

RowCounter = Callable[[], dict[str, int]]

LOCAL_URL = "http://localhost"
"""The app's base URL in tests: a name the server answers to by default (Host checks)."""


@pytest.fixture
def settings(migrated_database_url: str) -> Settings:
    """Settings for an app without the embedded worker (jobs stay queued)."""
    return Settings(database_url=migrated_database_url, embedded_worker=False)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The app, started (its lifespan finds the database at head) and stopped around the test."""
    with TestClient(
        create_app(settings), raise_server_exceptions=False, base_url=LOCAL_URL
    ) as test_client:
        yield test_client


@pytest.fixture
def app_sessionmaker(client: TestClient) -> sessionmaker[Session]:
    """The session factory the running app uses."""
    factory: sessionmaker[Session] = client.app.state.session_factory  # type: ignore[attr-defined]
    return factory


@pytest.fixture
def count_rows(app_sessionmaker: sessionmaker[Session]) -> RowCounter:
    """Return a function counting the rows of every table."""

    def count() -> dict[str, int]:
        with session_scope(app_sessionmaker) as session:
            return {
                table.__tablename__: session.scalar(select(func.count()).select_from(table)) or 0
                for table in (Dataset, Job, Model)
            }

    return count


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    """Twenty rows from two lines in two features."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 2))
    labels = rng.integers(0, 2, size=20)
    y = np.where(labels, X @ [1.0, -1.0] + 0.5, X @ [-2.0, 1.0] - 0.5)
    return X, y


@pytest.fixture
def noisy_data() -> tuple[np.ndarray, np.ndarray]:
    """A hundred rows from two lines in two features, with noise of standard deviation 0.5.

    Unlike ``data``, no line fits any row exactly, so a model's min-loss on one set of rows
    differs measurably from its min-loss on another.
    """
    rng = np.random.default_rng(1)
    X = rng.standard_normal((100, 2))
    labels = rng.integers(0, 2, size=100)
    y = np.where(labels, X @ [1.0, -1.0] + 0.5, X @ [-2.0, 1.0] - 0.5)
    return X, y + 0.5 * rng.standard_normal(100)


@pytest.fixture
def run_queued_jobs(app_sessionmaker: sessionmaker[Session], settings: Settings):
    """Return a function that claims and fits every queued job in this process."""

    def run() -> list[str]:
        statuses = []
        while True:
            with session_scope(app_sessionmaker) as session:
                job = job_store.claim_next_job(
                    session, worker_id="test-worker", now=datetime.now(UTC)
                )
                if job is None:
                    return statuses
                job_id = job.id
            statuses.append(run_job(job_id, settings.database_url, worker_id="test-worker"))

    return run


@pytest.fixture
def model_id(client: TestClient, data, run_queued_jobs) -> str:
    """Id of a model fitted through the API and the fit path (two features, k = 2)."""
    X, y = data
    response = client.post(
        "/fit",
        json={
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am",
            "params": {"n_init": 3},
            "seed": 1,
        },
    )
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    job = client.get(response.json()["url"]).json()
    model: str = job["model_id"]
    return model
