"""Every SQL statement of the project: reads and conditional writes of datasets, jobs, models.

Functions take the session first and everything else by keyword. They flush so that generated
values and constraint errors surface at once, but never commit: the caller's unit of work
(``session_scope``) decides.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, CursorResult, Select, delete, func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Delete, Update

from models_store.codecs import (
    decode_matrix,
    decode_vector,
    encode_matrix,
    encode_vector,
    to_json_value,
)
from models_store.tables import TERMINAL_JOB_STATUSES, Dataset, Job, Model

_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


def _new_id() -> str:
    return uuid.uuid4().hex


def _is_id(value: str) -> bool:
    """True if ``value`` has the form of a generated id; others name nothing and are never
    sent to the database (PostgreSQL refuses NUL characters in text, for one)."""
    return _ID_PATTERN.fullmatch(value) is not None


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _execute_counting(session: Session, statement: Update | Delete) -> int:
    # Bulk statements leave the identity map alone; callers expire what they changed.
    result = session.execute(statement, execution_options={"synchronize_session": False})
    return cast(CursorResult[Any], result).rowcount


def _update_job(
    session: Session, job_id: str, *conditions: ColumnElement[bool], **values: Any
) -> bool:
    """Apply ``values`` to the job if it still meets ``conditions``; True if it did.

    The conditions make each state change a compare-and-set, so a worker that lost its job
    (requeued, claimed by another, finished) cannot overwrite it.
    """
    statement = update(Job).where(Job.id == job_id, *conditions).values(**values)
    changed = _execute_counting(session, statement) == 1
    cached = session.identity_map.get(Session.identity_key(Job, job_id))
    if cached is not None:
        session.expire(cached)
    return changed


def _check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be non-negative, got {limit} and {offset}")


def _count(session: Session, query: Select[Any]) -> int:
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


# Datasets ---------------------------------------------------------------------------------------


def create_dataset(
    session: Session,
    *,
    X: npt.ArrayLike,
    y: npt.ArrayLike,
    feature_names: Sequence[str] | None,
    target_name: str | None,
    name: str | None,
) -> Dataset:
    """Store a design matrix ``X`` (n_rows, n_features) and target ``y`` (n_rows,).

    Without ``feature_names`` the features are called ``x0, x1, ...``.
    """
    X_array = np.asarray(X, dtype=np.float64)
    y_array = np.asarray(y, dtype=np.float64)
    if X_array.ndim != 2:
        raise ValueError(f"X must be a 2-D matrix, got shape {X_array.shape}")
    if y_array.shape != (X_array.shape[0],):
        raise ValueError(f"y must have shape ({X_array.shape[0]},), got {y_array.shape}")
    if not (np.isfinite(X_array).all() and np.isfinite(y_array).all()):
        raise ValueError("X and y must contain only finite numbers")
    n_rows, n_features = X_array.shape
    names = list(feature_names) if feature_names is not None else None
    if names is None:
        names = [f"x{j}" for j in range(n_features)]
    if len(names) != n_features:
        raise ValueError(f"got {len(names)} feature names for {n_features} features")
    dataset = Dataset(
        id=_new_id(),
        name=name,
        n_rows=n_rows,
        n_features=n_features,
        feature_names=names,
        target_name=target_name,
        x_data=encode_matrix(X_array),
        y_data=encode_vector(y_array),
        created_at=_utcnow(),
    )
    session.add(dataset)
    session.flush()
    return dataset


def get_dataset(session: Session, *, dataset_id: str) -> Dataset | None:
    """Return the dataset with this id, or None."""
    return session.get(Dataset, dataset_id) if _is_id(dataset_id) else None


def load_dataset_arrays(
    dataset: Dataset,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Decode the stored ``(X, y)`` arrays of ``dataset``."""
    X = decode_matrix(bytes(dataset.x_data), dataset.n_rows, dataset.n_features)
    y = decode_vector(bytes(dataset.y_data), dataset.n_rows)
    return X, y


def list_datasets(session: Session, *, limit: int, offset: int) -> tuple[list[Dataset], int]:
    """Return a page of datasets, newest first, and the total count."""
    query = select(Dataset)
    _check_page(limit, offset)
    page = session.scalars(
        query.order_by(Dataset.created_at.desc(), Dataset.id.desc()).limit(limit).offset(offset)
    )
    return list(page), _count(session, query)


# Jobs -------------------------------------------------------------------------------------------


def create_job(
    session: Session,
    *,
    dataset_id: str,
    algorithm: str,
    n_components: int,
    params: Mapping[str, Any],
    fit_intercept: bool,
    holdout_fraction: float,
    max_attempts: int,
    seed: int | None = None,
    time_budget_s: float | None = None,
    name: str | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    k_values: Sequence[int] | None = None,
) -> Job:
    """Queue a fit of ``dataset_id``; ``params`` are the validated algorithm parameters.

    ``k_values`` makes the job a k sweep (one model per k); ``n_components`` is then the
    largest of them.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    job = Job(
        id=_new_id(),
        status="queued",
        dataset_id=dataset_id,
        name=name,
        algorithm=algorithm,
        n_components=n_components,
        k_values=None if k_values is None else [int(k) for k in k_values],
        params=to_json_value(dict(params)),
        fit_intercept=fit_intercept,
        holdout_fraction=holdout_fraction,
        seed=seed,
        time_budget_s=time_budget_s,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        attempts=0,
        max_attempts=max_attempts,
        cancel_requested=False,
        progress_fraction=0.0,
        created_at=_utcnow(),
        warnings=[],
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, *, job_id: str) -> Job | None:
    """Return the job with this id, or None."""
    return session.get(Job, job_id) if _is_id(job_id) else None


def get_job_by_idempotency_key(session: Session, *, key: str) -> Job | None:
    """Return the job created with this ``Idempotency-Key``, or None."""
    return session.scalars(select(Job).where(Job.idempotency_key == key)).one_or_none()


def list_jobs(
    session: Session, *, status: str | None, limit: int, offset: int
) -> tuple[list[Job], int]:
    """Return a page of jobs (optionally only those in ``status``), newest first, and the total."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    _check_page(limit, offset)
    page = session.scalars(
        query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit).offset(offset)
    )
    return list(page), _count(session, query)


def claim_job(session: Session, *, job_id: str, worker_id: str, now: datetime) -> bool:
    """Move ``job_id`` from ``queued`` to ``running`` for ``worker_id``; False if it was not
    queued (already claimed, finished or cancelled), in which case no row changes.

    The claim is a conditional UPDATE on ``status = 'queued'`` checked by its row count, so of
    several processes racing for one job exactly one wins, whatever locks they hold.
    """
    return _update_job(
        session,
        job_id,
        Job.status == "queued",
        status="running",
        worker_id=worker_id,
        attempts=Job.attempts + 1,
        started_at=now,
        heartbeat_at=now,
    )


def claim_next_job(session: Session, *, worker_id: str, now: datetime) -> Job | None:
    """Atomically move the oldest queued job to ``running`` for ``worker_id``; None if none.

    Each candidate is taken with :func:`claim_job`; a racer that loses it tries the next one.
    On PostgreSQL the candidate is also locked with ``FOR UPDATE SKIP LOCKED`` so racers pick
    different rows instead of queueing behind each other (on SQLite it compiles to nothing,
    and ``BEGIN IMMEDIATE`` already serializes the transactions).
    """
    lost: list[str] = []
    while True:
        candidate = select(Job.id).where(Job.status == "queued")
        if lost:
            candidate = candidate.where(Job.id.not_in(lost))
        candidate = (
            candidate.order_by(Job.created_at, Job.id).limit(1).with_for_update(skip_locked=True)
        )
        job_id = session.scalars(candidate).first()
        if job_id is None:
            return None
        if claim_job(session, job_id=job_id, worker_id=worker_id, now=now):
            return session.get(Job, job_id)
        lost.append(job_id)


def _owned_by(worker_id: str) -> tuple[ColumnElement[bool], ...]:
    return (Job.status == "running", Job.worker_id == worker_id)


def heartbeat(session: Session, *, job_id: str, worker_id: str, now: datetime) -> bool:
    """Record that ``worker_id`` still runs ``job_id``; False if the job is no longer its own."""
    return _update_job(session, job_id, *_owned_by(worker_id), heartbeat_at=now)


def update_progress(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    fraction: float,
    iteration: int | None,
    candidates: int | None,
    best_loss: float | None,
    now: datetime,
    n_components: int | None = None,
) -> bool:
    """Record progress (which also counts as a heartbeat); False if the job is not owned.

    ``n_components`` is the k being fitted (of a k sweep).
    """
    return _update_job(
        session,
        job_id,
        *_owned_by(worker_id),
        progress_fraction=fraction,
        progress_iteration=iteration,
        progress_candidates=candidates,
        progress_best_loss=best_loss,
        progress_n_components=n_components,
        heartbeat_at=now,
    )


def request_cancel(session: Session, *, job_id: str, now: datetime | None = None) -> Job | None:
    """Cancel a job: a queued job is cancelled at once, a running one is flagged for its worker.

    A finished job is returned unchanged; None if there is no such job.
    """
    now = now or _utcnow()
    cancelled_while_queued = _update_job(
        session,
        job_id,
        Job.status == "queued",
        status="cancelled",
        cancel_requested=True,
        finished_at=now,
    )
    if not cancelled_while_queued:
        _update_job(session, job_id, Job.status == "running", cancel_requested=True)
    return session.get(Job, job_id)


def finish_job(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    status: str,
    now: datetime,
    error: str | None = None,
    model_id: str | None = None,
    sweep: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> bool:
    """Move a running job owned by ``worker_id`` to a terminal ``status``.

    ``sweep`` is the result of a k sweep, ``warnings`` what the fit found poor. Returns False
    if the job was taken away meanwhile (requeued by the reaper, or claimed by another
    worker), in which case nothing is written.
    """
    if status not in TERMINAL_JOB_STATUSES:
        raise ValueError(f"status must be one of {TERMINAL_JOB_STATUSES}, got {status!r}")
    values: dict[str, Any] = {
        "status": status,
        "error": error,
        "model_id": model_id,
        "sweep": None if sweep is None else to_json_value(dict(sweep)),
        "warnings": [str(warning) for warning in warnings],
        "finished_at": now,
    }
    if status == "succeeded":
        values["progress_fraction"] = 1.0
    return _update_job(session, job_id, *_owned_by(worker_id), **values)


# A job handed back to the queue: no owner, no run in progress.
_BACK_IN_QUEUE: dict[str, Any] = {
    "status": "queued",
    "worker_id": None,
    "heartbeat_at": None,
    "started_at": None,
    "progress_fraction": 0.0,
    "progress_iteration": None,
    "progress_candidates": None,
    "progress_best_loss": None,
    "progress_n_components": None,
}


def requeue_stale_jobs(
    session: Session, *, stale_before: datetime, now: datetime
) -> tuple[list[str], list[str]]:
    """Recover running jobs whose last heartbeat is older than ``stale_before``.

    A job with attempts left goes back to the queue; one that used all its attempts fails with
    a "worker lost" error; one whose cancellation was requested is cancelled. Returns the ids
    of the requeued and of the failed jobs.
    """
    stale = session.execute(
        select(Job.id, Job.heartbeat_at, Job.attempts, Job.max_attempts, Job.cancel_requested)
        .where(Job.status == "running", Job.heartbeat_at < stale_before)
        .order_by(Job.created_at, Job.id)
        .with_for_update(skip_locked=True)
    ).all()
    requeued: list[str] = []
    failed: list[str] = []
    for job_id, heartbeat_at, attempts, max_attempts, cancel_requested in stale:
        assert heartbeat_at is not None  # selected by heartbeat_at < stale_before
        # Conditional on the heartbeat read above: a worker that beat in between keeps its job.
        still_stale = (Job.status == "running", Job.heartbeat_at == heartbeat_at)
        if cancel_requested:
            _update_job(session, job_id, *still_stale, status="cancelled", finished_at=now)
        elif attempts < max_attempts:
            if _update_job(
                session,
                job_id,
                *still_stale,
                **_BACK_IN_QUEUE,
            ):
                requeued.append(job_id)
        elif _update_job(
            session,
            job_id,
            *still_stale,
            status="failed",
            finished_at=now,
            error=(
                f"worker lost: no heartbeat since {heartbeat_at.isoformat()}; "
                f"gave up after {attempts} attempts"
            ),
        ):
            failed.append(job_id)
    return requeued, failed


def release_jobs(session: Session, *, worker_id: str, now: datetime) -> list[str]:
    """Hand back the running jobs of a worker that is shutting down cleanly.

    They return to the queue at once, and the attempt they were on is not counted: the
    worker stopped them on purpose. A job whose cancellation was requested is cancelled.
    Returns the ids of the requeued jobs.
    """
    owned = session.execute(
        select(Job.id, Job.cancel_requested)
        .where(*_owned_by(worker_id))
        .order_by(Job.created_at, Job.id)
        .with_for_update()
    ).all()
    requeued: list[str] = []
    for job_id, cancel_requested in owned:
        if cancel_requested:
            _update_job(session, job_id, *_owned_by(worker_id), status="cancelled", finished_at=now)
        elif _update_job(
            session,
            job_id,
            *_owned_by(worker_id),
            attempts=Job.attempts - 1,
            **_BACK_IN_QUEUE,
        ):
            requeued.append(job_id)
    return requeued


def count_jobs_by_status(session: Session) -> dict[str, int]:
    """How many jobs are in each state (states with no job are left out)."""
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {status: count for status, count in rows}


def jobs_with_cancel_requested(session: Session, *, worker_id: str) -> list[str]:
    """Return the ids of running jobs of ``worker_id`` whose cancellation was requested."""
    return list(
        session.scalars(
            select(Job.id)
            .where(
                Job.status == "running",
                Job.worker_id == worker_id,
                Job.cancel_requested.is_(True),
            )
            .order_by(Job.created_at, Job.id)
        )
    )


# Models -----------------------------------------------------------------------------------------


def create_model(
    session: Session,
    *,
    job_id: str | None,
    dataset_id: str,
    name: str | None,
    algorithm: str,
    n_components: int,
    n_features: int,
    feature_names: Sequence[str],
    fit_intercept: bool,
    params: Mapping[str, Any],
    seed: int | None,
    coef: npt.ArrayLike,
    intercept: npt.ArrayLike,
    shares: npt.ArrayLike,
    train_min_loss: float,
    holdout_min_loss: float | None,
    baseline: Mapping[str, Any],
    n_train: int,
    n_holdout: int,
    loss_history: npt.ArrayLike,
    n_iter: int,
    fit_seconds: float,
    converged: bool | None = None,
    log_likelihood: float | None = None,
    bic: float | None = None,
    n_parameters: int | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    warnings: Sequence[str] = (),
) -> Model:
    """Store a fitted model; arrays are kept as JSON lists of exactly the same float64 values.

    ``coef`` has shape (n_components, n_features); ``intercept`` and ``shares`` have shape
    (n_components,). ``log_likelihood``, ``bic`` and ``n_parameters`` score the lines as a
    Gaussian mixture on the training rows; ``candidates`` is the search record of ``auto``.
    """
    coef_array = np.asarray(coef, dtype=np.float64)
    intercept_array = np.asarray(intercept, dtype=np.float64)
    shares_array = np.asarray(shares, dtype=np.float64)
    if coef_array.shape != (n_components, n_features):
        raise ValueError(
            f"coef must have shape ({n_components}, {n_features}), got {coef_array.shape}"
        )
    for label, array in (("intercept", intercept_array), ("shares", shares_array)):
        if array.shape != (n_components,):
            raise ValueError(f"{label} must have shape ({n_components},), got {array.shape}")
    if len(feature_names) != n_features:
        raise ValueError(f"got {len(feature_names)} feature names for {n_features} features")
    model = Model(
        id=_new_id(),
        job_id=job_id,
        dataset_id=dataset_id,
        name=name,
        algorithm=algorithm,
        n_components=n_components,
        n_features=n_features,
        feature_names=list(feature_names),
        fit_intercept=fit_intercept,
        params=to_json_value(dict(params)),
        seed=seed,
        coef=to_json_value(coef_array),
        intercept=to_json_value(intercept_array),
        shares=to_json_value(shares_array),
        train_min_loss=float(train_min_loss),
        holdout_min_loss=None if holdout_min_loss is None else float(holdout_min_loss),
        baseline=to_json_value(dict(baseline)),
        n_train=n_train,
        n_holdout=n_holdout,
        loss_history=to_json_value(np.asarray(loss_history, dtype=np.float64).ravel()),
        n_iter=n_iter,
        fit_seconds=float(fit_seconds),
        created_at=_utcnow(),
        converged=converged,
        log_likelihood=None if log_likelihood is None else float(log_likelihood),
        bic=None if bic is None else float(bic),
        n_parameters=n_parameters,
        candidates=(
            None if candidates is None else to_json_value([dict(item) for item in candidates])
        ),
        warnings=[str(warning) for warning in warnings],
    )
    session.add(model)
    session.flush()
    return model


def get_model(session: Session, *, model_id: str) -> Model | None:
    """Return the model with this id, or None."""
    return session.get(Model, model_id) if _is_id(model_id) else None


def list_models(session: Session, *, limit: int, offset: int) -> tuple[list[Model], int]:
    """Return a page of models, newest first, and the total count."""
    query = select(Model)
    _check_page(limit, offset)
    page = session.scalars(
        query.order_by(Model.created_at.desc(), Model.id.desc()).limit(limit).offset(offset)
    )
    return list(page), _count(session, query)


def delete_model(session: Session, *, model_id: str) -> bool:
    """Delete a model; False if there was none. Jobs keep their (now dangling) model id."""
    if not _is_id(model_id):
        return False
    deleted = _execute_counting(session, delete(Model).where(Model.id == model_id)) == 1
    cached = session.identity_map.get(Session.identity_key(Model, model_id))
    if cached is not None:
        session.expunge(cached)
    return deleted
