"""Scale-out pieces as plain functions: a job and its Procrastinate task in one transaction,
the settings that choose the worker, and the model cache kept true across processes."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import migrate
from models_store import models as model_store
from models_store.session import make_engine, make_sessionmaker, session_scope
from models_store.tables import Dataset, Job
from service.config import SettingsError, load_settings
from service.fit_schemas import FitRequest
from service.jobs.procrastinate_worker import claim_for_task
from service.jobs.submit import prepare_fit, submit_fit
from service.jobs.task_queue import FIT_QUEUE, FIT_TASK, FitTaskQueue
from service.main import create_app
from service.serving.cache_check import evict_deleted_models
from service.serving.prediction import ModelCache, StoredLines

MIXREG = str(Path(sys.executable).parent / "mixreg")
fit_request = TypeAdapter(FitRequest)


class InjectedError(Exception):
    """Stands for anything going wrong inside the unit of work (a crash, a lost connection)."""


@pytest.fixture
def postgres_sessions(postgres_url):
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def submit(session: Session, enqueue) -> str:
    rng = np.random.default_rng(0)
    request = fit_request.validate_python(
        {"data": {"X": rng.standard_normal((20, 2)).tolist(), "y": [0.0] * 20}, "k": 2}
    )
    submission = submit_fit(
        session,
        fit=prepare_fit(request),
        idempotency_key=None,
        max_attempts=3,
        max_k_sweep=20,
        enqueue=enqueue,
    )
    return submission.job.id


def counts(session_factory) -> tuple[int, int, int]:
    """Datasets, jobs and fit tasks stored."""
    with session_scope(session_factory) as session:
        return (
            session.scalar(select(func.count()).select_from(Dataset)),
            session.scalar(select(func.count()).select_from(Job)),
            session.scalar(text("SELECT count(*) FROM procrastinate_jobs")),
        )


def test_a_job_and_its_task_are_committed_together(postgres_sessions):
    with session_scope(postgres_sessions) as session:
        job_id = submit(session, FitTaskQueue().enqueue)

    with session_scope(postgres_sessions) as session:
        job = job_store.get_job(session, job_id=job_id)
        task = session.execute(
            text("SELECT id, task_name, queue_name, status, args FROM procrastinate_jobs")
        ).one()
    assert task == (job.task_id, FIT_TASK, FIT_QUEUE, "todo", {"job_id": job_id})


def test_a_failure_between_insert_and_defer_leaves_neither(postgres_sessions):
    def fail_before_defer(session: Session, job_id: str) -> None:
        assert job_store.get_job(session, job_id=job_id) is not None  # inserted, uncommitted
        raise InjectedError

    with pytest.raises(InjectedError), session_scope(postgres_sessions) as session:
        submit(session, fail_before_defer)

    assert counts(postgres_sessions) == (0, 0, 0)


def test_a_failure_after_the_defer_leaves_neither(postgres_sessions):
    queue = FitTaskQueue()

    def fail_after_defer(session: Session, job_id: str) -> None:
        queue.enqueue(session, job_id)
        raise InjectedError

    with pytest.raises(InjectedError), session_scope(postgres_sessions) as session:
        submit(session, fail_after_defer)

    assert counts(postgres_sessions) == (0, 0, 0)


def test_cancelling_a_queued_job_cancels_its_task_in_the_same_transaction(postgres_sessions):
    queue = FitTaskQueue()
    with session_scope(postgres_sessions) as session:
        job_id = submit(session, queue.enqueue)

    with session_scope(postgres_sessions) as session:
        job = job_store.request_cancel(session, job_id=job_id)
        assert job is not None and job.task_id is not None
        assert queue.abort(session, job.task_id)

    with session_scope(postgres_sessions) as session:
        assert job_store.get_job(session, job_id=job_id).status == "cancelled"
        assert session.scalar(text("SELECT status FROM procrastinate_jobs")) == "cancelled"
        assert not queue.abort(session, job.task_id)  # nothing left to cancel


def test_the_queue_summary_counts_waiting_tasks(postgres_sessions):
    queue = FitTaskQueue()
    with session_scope(postgres_sessions) as session:
        submit(session, queue.enqueue)
        submit(session, queue.enqueue)
    with session_scope(postgres_sessions) as session:
        summary = queue.summary(session, stale_after_s=15)
    assert summary is not None and (summary.workers, summary.waiting) == (0, 2)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (
            {"MIXREG_WORKER": "procrastinate", "MIXREG_DATABASE_URL": "sqlite:///./x.db"},
            "MIXREG_WORKER=procrastinate needs PostgreSQL (Procrastinate keeps its queue there), "
            "but MIXREG_DATABASE_URL is sqlite:///./x.db; set a postgresql+psycopg:// URL or "
            "MIXREG_WORKER=embedded",
        ),
        (
            {"MIXREG_WORKER": "procrastinate", "MIXREG_DATABASE_URL": "mysql://u:secret@db/x"},
            "MIXREG_WORKER=procrastinate needs PostgreSQL (Procrastinate keeps its queue there), "
            "but MIXREG_DATABASE_URL is mysql://u:***@db/x; set a postgresql+psycopg:// URL or "
            "MIXREG_WORKER=embedded",
        ),
        (
            {
                "MIXREG_WORKER": "procrastinate",
                "MIXREG_DATABASE_URL": "postgresql+psycopg://db/x",
                "MIXREG_EMBEDDED_WORKER": "true",
            },
            "MIXREG_EMBEDDED_WORKER=true contradicts MIXREG_WORKER=procrastinate: with "
            "Procrastinate, fits run only in `mixreg worker` processes; unset "
            "MIXREG_EMBEDDED_WORKER",
        ),
        (
            {"MIXREG_WORKER": "celery"},
            "MIXREG_WORKER: Input should be 'embedded' or 'procrastinate'",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_variables(
    monkeypatch, environment, message
):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == message
    with pytest.raises(SettingsError):
        create_app()  # what `uvicorn --factory` and `mixreg serve` call


def test_procrastinate_mode_runs_no_embedded_worker(monkeypatch):
    monkeypatch.setenv("MIXREG_WORKER", "procrastinate")
    monkeypatch.setenv("MIXREG_DATABASE_URL", "postgresql+psycopg://db/x")
    assert not load_settings().runs_embedded_worker
    monkeypatch.setenv("MIXREG_EMBEDDED_WORKER", "false")
    assert not load_settings().runs_embedded_worker
    monkeypatch.setenv("MIXREG_WORKER", "embedded")
    assert not load_settings().runs_embedded_worker
    monkeypatch.delenv("MIXREG_EMBEDDED_WORKER")
    assert load_settings().runs_embedded_worker


def run_mixreg(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **environment}
    return subprocess.run([MIXREG, *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_commands_refuse_procrastinate_without_postgresql():
    for command in (["serve"], ["worker"]):
        result = run_mixreg(
            *command, MIXREG_WORKER="procrastinate", MIXREG_DATABASE_URL="sqlite:///./x.db"
        )
        assert result.returncode == 2
        assert result.stderr.startswith(
            "mixreg: MIXREG_WORKER=procrastinate needs PostgreSQL (Procrastinate keeps its "
            "queue there), but MIXREG_DATABASE_URL is sqlite:///./x.db;"
        )


def test_the_worker_command_needs_the_procrastinate_mode():
    result = run_mixreg("worker", MIXREG_DATABASE_URL="sqlite:///./x.db")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mixreg worker: runs the fits queued with MIXREG_WORKER=procrastinate, but "
        "MIXREG_WORKER is embedded; set MIXREG_WORKER=procrastinate and a PostgreSQL "
        "MIXREG_DATABASE_URL for the API processes and the workers alike"
    )
    bad = run_mixreg("worker", "--concurrency", "0")
    assert bad.returncode == 2
    assert "argument --concurrency: must be at least 1, got 0" in bad.stderr


def test_models_deleted_elsewhere_leave_the_cache(db_sessionmaker):
    with session_scope(db_sessionmaker) as session:
        dataset_id = dataset_store.create_dataset(
            session, X=np.eye(3), y=np.ones(3), feature_names=None, target_name=None, name=None
        ).id
        model_ids = [
            model_store.create_model(
                session,
                model_store.ModelRecord(
                    job_id=None,
                    dataset_id=dataset_id,
                    name=None,
                    algorithm="am",
                    n_components=1,
                    n_features=3,
                    feature_names=["a", "b", "c"],
                    fit_intercept=True,
                    params={},
                    seed=0,
                    coef=[[1.0, 2.0, 3.0]],
                    intercept=[0.5],
                    shares=[1.0],
                    train_min_loss=0.0,
                    holdout_min_loss=None,
                    baseline={},
                    n_train=3,
                    n_holdout=0,
                    loss_history=[0.0],
                    n_iter=1,
                    fit_seconds=0.0,
                ),
            ).id
            for _ in range(3)
        ]
    cache = ModelCache(capacity=8)
    with session_scope(db_sessionmaker) as session:
        for model_id in model_ids:
            cache.put(StoredLines.of_model(model_store.get_model(session, model_id=model_id)))
    assert evict_deleted_models(cache, db_sessionmaker) == []

    # Deleted through another process: this one's cache still holds it until the check.
    with session_scope(db_sessionmaker) as session:
        assert model_store.delete_model(session, model_id=model_ids[1])

    assert evict_deleted_models(cache, db_sessionmaker) == [model_ids[1]]
    assert sorted(cache.model_ids()) == sorted([model_ids[0], model_ids[2]])
    assert evict_deleted_models(ModelCache(capacity=8), db_sessionmaker) == []


def job_row(session_factory, job_id: str) -> tuple:
    with session_scope(session_factory) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        return (job.status, job.worker_id, job.attempts, job.started_at, job.finished_at)


def test_a_task_claims_its_queued_job_once(postgres_sessions):
    with session_scope(postgres_sessions) as session:
        job_id = submit(session, FitTaskQueue().enqueue)
    first = claim_for_task(postgres_sessions, job_id=job_id, worker_id="worker-a")
    assert (first.claimed, first.found, first.algorithm) == (True, "running", "auto")
    assert job_row(postgres_sessions, job_id)[:3] == ("running", "worker-a", 1)
    # The same task delivered again (a retry) finds the job running and leaves it alone.
    again = claim_for_task(postgres_sessions, job_id=job_id, worker_id="worker-b")
    assert (again.claimed, again.found) == (False, "running")
    assert job_row(postgres_sessions, job_id)[:3] == ("running", "worker-a", 1)


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled", "running elsewhere"])
def test_a_retried_task_leaves_a_job_that_is_not_queued_alone(postgres_sessions, state):
    now = datetime.now(UTC)
    with session_scope(postgres_sessions) as session:
        job_id = submit(session, FitTaskQueue().enqueue)
    with session_scope(postgres_sessions) as session:
        if state == "cancelled":
            job_store.request_cancel(session, job_id=job_id, now=now)
        else:
            assert job_store.claim_job(session, job_id=job_id, worker_id="worker-a", now=now)
            if state != "running elsewhere":
                job_store.finish_job(
                    session, job_id=job_id, worker_id="worker-a", status=state, error=None, now=now
                )
    before = job_row(postgres_sessions, job_id)
    claim = claim_for_task(postgres_sessions, job_id=job_id, worker_id="worker-b")
    assert not claim.claimed
    assert claim.found == ("running" if state == "running elsewhere" else state)
    assert job_row(postgres_sessions, job_id) == before


def test_a_task_whose_job_is_gone_claims_nothing(postgres_sessions):
    claim = claim_for_task(postgres_sessions, job_id="0" * 32, worker_id="worker-b")
    assert (claim.claimed, claim.found) == (False, "missing")
