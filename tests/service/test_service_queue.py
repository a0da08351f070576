"""The embedded worker in this process, with real fit processes."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import session_scope
from service.config import Settings
from service.jobs.queue import EmbeddedWorker


@pytest.fixture
def worker(db_sessionmaker, migrated_database_url):
    settings = Settings(
        database_url=migrated_database_url,
        worker_concurrency=2,
        heartbeat_interval_s=0.2,
        # Far longer than a heartbeat can be delayed on a loaded machine, so the reaper never
        # takes a job from a live fit; the lost-worker test backdates its claim instead.
        stale_after_s=60,
        progress_interval_s=0.1,
    )
    embedded = EmbeddedWorker(session_factory=db_sessionmaker, settings=settings)
    yield embedded
    embedded.stop()


def queue_jobs(sessionmaker, count: int, **job_fields) -> list[str]:
    rng = np.random.default_rng(0)
    with session_scope(sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=rng.standard_normal((40, 2)),
            y=rng.standard_normal(40),
            feature_names=None,
            target_name=None,
            name=None,
        )
        fields = {
            "algorithm": "am",
            "n_components": 2,
            "params": {},
            "fit_intercept": True,
            "holdout_fraction": 0.2,
            "max_attempts": 3,
            **job_fields,
        }
        return [
            job_store.create_job(session, job_store.JobRecord(dataset_id=dataset.id, **fields)).id
            for _ in range(count)
        ]


def job_of(sessionmaker, job_id):
    with session_scope(sessionmaker) as session:
        return job_store.get_job(session, job_id=job_id)


def statuses_of(sessionmaker, job_ids) -> list[str]:
    return [job_of(sessionmaker, job_id).status for job_id in job_ids]


# A sub-sample search with far more partitions than it can try and a budget no test waits
# for: it runs until the worker stops it.
ENDLESS_FIT = {
    "algorithm": "subsample",
    "time_budget_s": 3000,
    "params": {"n_partitions": 10**9, "subsample_size": 20},
}


def run_until(worker, condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        worker.run_once()
        time.sleep(0.05)


def test_runs_at_most_the_configured_number_of_fits_at_once(worker, db_sessionmaker):
    job_ids = queue_jobs(db_sessionmaker, 3, **ENDLESS_FIT)
    worker.run_once()
    assert statuses_of(db_sessionmaker, job_ids) == ["running", "running", "queued"]
    assert sorted(worker._running) == sorted(job_ids[:2])

    worker.run_once()  # no slot is free
    assert statuses_of(db_sessionmaker, job_ids) == ["running", "running", "queued"]

    with session_scope(db_sessionmaker) as session:
        job_store.request_cancel(session, job_id=job_ids[0])
    run_until(worker, lambda: job_of(db_sessionmaker, job_ids[2]).status == "running")
    assert statuses_of(db_sessionmaker, job_ids) == ["cancelled", "running", "running"]
    assert sorted(worker._running) == sorted(job_ids[1:])


def test_every_queued_job_runs_once_and_succeeds(worker, db_sessionmaker):
    job_ids = queue_jobs(db_sessionmaker, 4)
    most_running = 0

    def all_succeeded() -> bool:
        nonlocal most_running
        statuses = statuses_of(db_sessionmaker, job_ids)
        most_running = max(most_running, statuses.count("running"))
        return statuses == ["succeeded"] * 4

    run_until(worker, all_succeeded)
    assert most_running <= 2
    jobs = [job_of(db_sessionmaker, job_id) for job_id in job_ids]
    assert [(job.worker_id, job.attempts) for job in jobs] == [(worker.worker_id, 1)] * 4


def test_a_fit_process_that_dies_fails_its_job(worker, db_sessionmaker):
    [job_id] = queue_jobs(db_sessionmaker, 1, **ENDLESS_FIT)
    worker.run_once()
    os.kill(worker._running[job_id].process.pid, signal.SIGKILL)
    run_until(worker, lambda: job_of(db_sessionmaker, job_id).status != "running")
    job = job_of(db_sessionmaker, job_id)
    assert job.status == "failed"
    assert job.error == "the fit process was killed by SIGKILL before it finished the job"


def test_jobs_of_a_lost_worker_are_requeued_and_run(worker, db_sessionmaker):
    [job_id] = queue_jobs(db_sessionmaker, 1)
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    with session_scope(db_sessionmaker) as session:
        job_store.claim_next_job(session, worker_id="dead-worker", now=long_ago)
    run_until(worker, lambda: job_of(db_sessionmaker, job_id).status == "succeeded")
    job = job_of(db_sessionmaker, job_id)
    assert (job.attempts, job.worker_id) == (2, worker.worker_id)


def test_stop_ends_running_fits(worker, db_sessionmaker):
    [job_id] = queue_jobs(db_sessionmaker, 1, **ENDLESS_FIT)
    worker.run_once()
    process = worker._running[job_id].process
    worker.stop()
    assert not process.is_alive()


def test_stopping_the_worker_puts_its_running_fit_back_in_the_queue(worker, db_sessionmaker):
    [job_id] = queue_jobs(db_sessionmaker, 1, **ENDLESS_FIT)
    worker.run_once()
    process = worker._running[job_id].process
    run_until(worker, lambda: job_of(db_sessionmaker, job_id).progress_candidates is not None)
    worker.stop()
    assert not process.is_alive()
    job = job_of(db_sessionmaker, job_id)
    assert (job.status, job.attempts, job.worker_id, job.progress_candidates) == (
        "queued",
        0,
        None,
        None,
    )
