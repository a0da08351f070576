"""Fit processes run at a lower CPU priority than their worker (``MIXREG_FIT_NICENESS``)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

import numpy as np
import pytest
from pydantic import ValidationError

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import session_scope
from service.config import Settings
from service.data import json_bodies
from service.jobs.supervisor import FitSupervisor


def _claimed_slow_job(db_sessionmaker) -> str:
    """A claimed job whose fit takes seconds: auto, k = 4, on 100,000 rows."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100_000, 5))
    y = np.abs(X).sum(axis=1) + 0.1 * rng.standard_normal(100_000)
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name=None, name=None
        )
        job_id = job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="auto",
                n_components=4,
                params={},
                fit_intercept=True,
                holdout_fraction=0.0,
                max_attempts=1,
            ),
        ).id
        assert job_store.claim_next_job(session, worker_id="w", now=datetime.now(UTC))
    return job_id


def _niceness_while_running(supervisor: FitSupervisor, job_id: str, expected: int) -> set[int]:
    """The niceness values the fit process of ``job_id`` was seen at, until it was seen at
    ``expected`` (then it is stopped) or it ended."""
    fit = supervisor.start(job_id, "auto", 1)
    assert fit is not None and fit.pid is not None
    seen: set[int] = set()
    try:
        while fit.process.is_alive() and expected not in seen:
            try:
                seen.add(os.getpriority(os.PRIO_PROCESS, fit.pid))
            except ProcessLookupError:
                break
            time.sleep(0.01)
    finally:
        fit.process.kill()
        fit.process.join()
        fit.alive_writer.close()
    return seen


@pytest.mark.parametrize("niceness", [10, 3])
def test_a_fit_process_runs_niceness_steps_below_its_worker(db_sessionmaker, sqlite_url, niceness):
    settings = Settings(database_url=sqlite_url, embedded_worker=False, fit_niceness=niceness)
    supervisor = FitSupervisor(session_factory=db_sessionmaker, settings=settings, worker_id="w")
    own = os.getpriority(os.PRIO_PROCESS, 0)
    # The kernel caps niceness at 19.
    expected = min(own + niceness, 19)
    seen = _niceness_while_running(supervisor, _claimed_slow_job(db_sessionmaker), expected)
    # Right after the start the process may still run at its parent's niceness; before the fit
    # loads its data it is `niceness` steps nicer (the fit lasts seconds: it is seen there).
    assert expected in seen
    assert seen <= {own, expected}


@pytest.mark.parametrize("value", [-1, 20])
def test_a_niceness_outside_0_to_19_is_refused(value):
    with pytest.raises(ValidationError, match="fit_niceness"):
        Settings(fit_niceness=value)


def test_big_json_bodies_are_parsed_at_the_fit_niceness():
    json_bodies.stop_parsers()
    json_bodies.set_parser_niceness(7)
    try:
        parser_niceness = json_bodies._parsers().submit(os.nice, 0).result(timeout=120)
        assert parser_niceness == min(os.nice(0) + 7, 19)
    finally:
        json_bodies.stop_parsers()
        json_bodies.set_parser_niceness(0)
