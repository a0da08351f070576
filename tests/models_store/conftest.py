"""Fixtures for the storage tests: a stored dataset and a factory of queued jobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import session_scope
from models_store.tables import Job

JobFactory = Callable[..., Job]


@pytest.fixture
def dataset_id(db_sessionmaker: sessionmaker[Session]) -> str:
    """Id of a small committed dataset (6 rows, 2 features)."""
    rng = np.random.default_rng(0)
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=rng.standard_normal((6, 2)),
            y=rng.standard_normal(6),
            feature_names=["a", "b"],
            target_name="t",
            name="small",
        )
        return dataset.id


@pytest.fixture
def make_job(dataset_id: str) -> JobFactory:
    """Return a function that queues a job on ``dataset_id`` in the given session."""

    def make(session: Session, **overrides: Any) -> Job:
        fields: dict[str, Any] = {
            "dataset_id": dataset_id,
            "algorithm": "am",
            "n_components": 2,
            "params": {"step_size": 0.1, "max_iter": 100, "init": None},
            "fit_intercept": True,
            "holdout_fraction": 0.2,
            "max_attempts": 3,
            "seed": 7,
        }
        fields.update(overrides)
        return job_store.create_job(session, job_store.JobRecord(**fields))

    return make
