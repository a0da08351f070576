"""A fit's time budget ends before the job time limit, and the limit does not count the time
the fit process spends loading its data."""

from __future__ import annotations

import multiprocessing
import time
from datetime import UTC, datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import session_scope
from service.config import Settings
from service.jobs.supervisor import FitSupervisor, RunningFit
from service.main import create_app
from tests.service.conftest import LOCAL_URL
from tests.service.test_service_api_bad_input import assert_problem

# Enough rows for a sweep up to k = 2 (each line must own p + 1 of the training rows).
X = [[float(row), float(row * 7 % 5)] for row in range(20)]
Y = [float(row * 3 % 7) - 2.0 for row in range(20)]


@pytest.fixture
def ten_second_jobs(sqlite_url):
    settings = Settings(
        database_url=sqlite_url,
        embedded_worker=False,
        job_time_limit_s=10.0,
        max_time_budget_s=10.0,
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        yield client


def fit(**overrides):
    return {"data": {"X": X, "y": Y}, "k": 2, "algorithm": "subsample", **overrides}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            fit(time_budget_s=10),
            "time_budget_s = 10 would not end before the job time limit: a job's budgets must "
            "add up to less than 9 s (90% of MIXREG_JOB_TIME_LIMIT_S = 10); lower it",
        ),
        (
            fit(k=[1, 2], time_budget_s=4.5),
            "time_budget_s = 4.5 for each of the 2 values of k adds up to 9 s, which would not "
            "end before the job time limit: a job's budgets must add up to less than 9 s (90% "
            "of MIXREG_JOB_TIME_LIMIT_S = 10); lower it or split the sweep",
        ),
    ],
    ids=["single-k", "sweep"],
)
def test_a_budget_that_would_not_end_before_the_time_limit_is_refused(
    ten_second_jobs, body, detail
):
    problem = assert_problem(ten_second_jobs.post("/fit", json=body), 422, detail)
    assert [error["loc"] for error in problem["errors"]] == [["body", "time_budget_s"]]


def test_a_budget_that_ends_before_the_time_limit_is_accepted(ten_second_jobs):
    assert ten_second_jobs.post("/fit", json=fit(time_budget_s=8.9)).status_code == 202
    assert ten_second_jobs.post("/fit", json=fit(k=[1, 2], time_budget_s=4.4)).status_code == 202


def test_the_largest_budget_allowed_by_default_ends_before_the_default_time_limit(sqlite_url):
    settings = Settings(database_url=sqlite_url, embedded_worker=False)
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        response = client.post("/fit", json=fit(time_budget_s=settings.max_time_budget_s))
        assert response.status_code == 202, response.text


def test_the_time_limit_counts_from_the_end_of_the_data_load(db_sessionmaker, sqlite_url):
    settings = Settings(database_url=sqlite_url, embedded_worker=False, job_time_limit_s=0.5)
    supervisor = FitSupervisor(session_factory=db_sessionmaker, settings=settings, worker_id="w")
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.ones((3, 1)),
            y=np.ones(3),
            feature_names=None,
            target_name=None,
            name=None,
        )
        job_id = job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="am",
                n_components=1,
                params={},
                fit_intercept=True,
                holdout_fraction=0.0,
                max_attempts=1,
            ),
        ).id
        assert job_store.claim_next_job(session, worker_id="w", now=datetime.now(UTC))
    context = multiprocessing.get_context("spawn")
    # Stands for a fit process that is still loading its data.
    process = context.Process(target=time.sleep, args=(60,))
    process.start()
    _, alive_writer = context.Pipe(duplex=False)
    data_loaded = context.Event()
    fit_ = RunningFit(
        job_id=job_id,
        algorithm="am",
        attempt=1,
        process=process,
        started=time.monotonic() - 60,  # loading for a minute already
        alive_writer=alive_writer,
        data_loaded=data_loaded,
    )
    try:
        assert supervisor.check(fit_, cancel_requested=False) is None
        assert process.is_alive()
        data_loaded.set()
        assert supervisor.check(fit_, cancel_requested=False) is None
        time.sleep(0.6)
        assert supervisor.check(fit_, cancel_requested=False) == "failed"
        assert not process.is_alive()
    finally:
        if process.is_alive():
            process.kill()
        process.join()
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.error) == ("failed", "time limit of 0.5 s exceeded")
