"""A fit whose dataset loads slowly is not taken for a lost worker, and a fit process whose
attempt was superseded stops: the fit process runs as the workers start it, with its dataset
read slowed down on purpose, while the reaper's statement runs beside it."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import session_scope
from service.jobs.training import run_job

HEARTBEAT_INTERVAL_S = 0.2
STALE_AFTER_S = 1.5
SLOW_LOAD_S = 4 * STALE_AFTER_S
# The exit status of a fit process that found its attempt superseded (service.jobs.lease).
EXIT_ATTEMPT_SUPERSEDED = 76


def _run_job_loading_slowly(
    job_id: str, database_url: str, worker_id: str, delay_s: float, started: Any
) -> None:
    """``run_job`` in a fresh process, its dataset read taking ``delay_s`` longer; ``started``
    is set once the process has imported the fit code (a worker's fork server has it
    imported beforehand)."""
    started.set()
    read_blocks = dataset_store.iter_dataset_blocks

    def slow_blocks(session: Session, *, dataset: Any) -> Iterator[Any]:
        time.sleep(delay_s)
        yield from read_blocks(session, dataset=dataset)

    dataset_store.iter_dataset_blocks = slow_blocks  # type: ignore[assignment]
    run_job(
        job_id,
        database_url,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        progress_interval_s=0.1,
        worker_id=worker_id,
    )


def _queue_job(factory: sessionmaker[Session]) -> str:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 1))
    y = np.where(rng.random(60) < 0.5, 2 * X[:, 0], -2 * X[:, 0])
    with session_scope(factory) as session:
        dataset = dataset_store.create_dataset(
            session, X=X, y=y, feature_names=None, target_name=None, name=None
        )
        return job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="am-classic",
                n_components=2,
                params={},
                fit_intercept=True,
                holdout_fraction=0.0,
                seed=0,
                max_attempts=3,
            ),
        ).id


def _claim(factory: sessionmaker[Session], worker_id: str) -> int:
    with session_scope(factory) as session:
        job = job_store.claim_next_job(session, worker_id=worker_id, now=datetime.now(UTC))
        assert job is not None
        return job.attempts


def _reap(factory: sessionmaker[Session]) -> list[str]:
    """One round of the reaper: requeue the jobs whose heartbeat is older than STALE_AFTER_S."""
    now = datetime.now(UTC)
    with session_scope(factory) as session:
        requeued, failed = job_store.requeue_stale_jobs(
            session, stale_before=now - timedelta(seconds=STALE_AFTER_S), now=now
        )
    return requeued + failed


def _fit_process(
    factory: sessionmaker[Session], job_id: str, database_url: str, worker_id: str, delay_s: float
) -> Any:
    """Start the fit process of ``job_id`` as a worker does: once it runs, the worker renews
    the claim's heartbeat (``FitSupervisor.start``); from then on the process beats itself."""
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    process = context.Process(
        target=_run_job_loading_slowly, args=(job_id, database_url, worker_id, delay_s, started)
    )
    process.start()
    assert started.wait(120), "the fit process did not start"
    with session_scope(factory) as session:
        assert job_store.heartbeat(
            session, job_id=job_id, worker_id=worker_id, now=datetime.now(UTC)
        )
    return process


def test_a_dataset_that_loads_for_longer_than_stale_after_is_not_a_lost_worker(
    migrated_database_url, db_sessionmaker
):
    job_id = _queue_job(db_sessionmaker)
    _claim(db_sessionmaker, "w")
    process = _fit_process(db_sessionmaker, job_id, migrated_database_url, "w", SLOW_LOAD_S)
    reaped: list[str] = []
    try:
        deadline = time.monotonic() + SLOW_LOAD_S + 60
        while process.is_alive() and time.monotonic() < deadline:
            reaped += _reap(db_sessionmaker)
            time.sleep(0.1)
    finally:
        if process.is_alive():
            process.kill()
        process.join()
    assert reaped == []
    assert process.exitcode == 0
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.attempts, job.error) == ("succeeded", 1, None)


def test_a_fit_process_whose_attempt_was_superseded_exits(migrated_database_url, db_sessionmaker):
    job_id = _queue_job(db_sessionmaker)
    _claim(db_sessionmaker, "w")
    # The first attempt would load for a minute: long enough to see whether it stops by itself.
    process = _fit_process(db_sessionmaker, job_id, migrated_database_url, "w", 60.0)
    with session_scope(db_sessionmaker) as session:
        renewed = job_store.get_job(session, job_id=job_id).heartbeat_at  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with session_scope(db_sessionmaker) as session:
                job = job_store.get_job(session, job_id=job_id)
                assert job is not None and job.heartbeat_at is not None
                if job.heartbeat_at > renewed:  # the fit process beats: it is loading
                    break
            time.sleep(0.05)
        # The reaper takes the job away and the same worker claims it again: attempt 2.
        with session_scope(db_sessionmaker) as session:
            far_future = datetime.now(UTC) + timedelta(days=1)
            requeued, _ = job_store.requeue_stale_jobs(
                session, stale_before=far_future, now=datetime.now(UTC)
            )
            assert requeued == [job_id]
        assert _claim(db_sessionmaker, "w") == 2
        process.join(timeout=10 * HEARTBEAT_INTERVAL_S + 10)
        assert not process.is_alive(), "the superseded fit process is still loading"
        assert process.exitcode == EXIT_ATTEMPT_SUPERSEDED
    finally:
        if process.is_alive():
            process.kill()
        process.join()
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.attempts, job.worker_id) == ("running", 2, "w")
