"""The process entry of a fit: :func:`run_job` loads a claimed job, fits it (a keyed job with
the shards of :mod:`service.jobs.shards`) and stores its models; :func:`run_shards` fits a
keyed job's free shards beside it. Both run in a child process of whichever worker claimed
the job, through one entry (:func:`_in_fit_process`).

The job's process heartbeats (:mod:`service.jobs.lease`), writes throttled progress, and
stops when the job's cancellation is requested or the job is taken away from it. What a fit
is lives in :mod:`service.jobs.fit_spec`, how it is fitted and recorded in
:mod:`service.jobs.fitting`. A k sweep stores all its models together when the last one is
done: a sweep that is cancelled or fails stores none.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from typing import Any, TypeVar

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store import registry
from models_store import shards as shard_store
from models_store.common import database_now
from models_store.session import make_engine, make_sessionmaker, read_scope, session_scope
from models_store.tables import Dataset
from service.config import (
    DEFAULT_KEYED_GLOBAL_ROWS,
    DEFAULT_MAX_KEY_CHARS,
    DEFAULT_MAX_KEYED_COEFFICIENTS,
)
from service.data.columns import load_columns
from service.errors import InvalidInputError
from service.jobs.fit_columns import (
    GROUPS,
    WEIGHTS,
    check_concomitant_values,
    check_values,
    wanted_columns,
)
from service.jobs.fit_spec import FitSpec, TrainHoldout
from service.jobs.fitting import FittedSweep, fit_split, sweep_record
from service.jobs.lease import FitCancelledError, Heartbeat, JobLostError, JobProgress
from service.jobs.shards import (
    KeyedData,
    KeyedLimits,
    ShardStore,
    fit_free_shards,
    fit_keyed,
    key_blocks,
    keyed_global_sample,
    read_keyed_rows,
)
from service.logs import LogFormat, configure_logging, job_context

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


def run_job(
    job_id: str,
    database_url: str,
    *,
    heartbeat_interval_s: float = 1.0,
    progress_interval_s: float = 0.5,
    worker_id: str | None = None,
    attempt: int | None = None,
    worker_alive: Connection | None = None,
    data_loaded: EventType | None = None,
    log_format: LogFormat | None = None,
    stale_after_s: float = 15.0,
    keyed_global_rows: int = DEFAULT_KEYED_GLOBAL_ROWS,
    max_key_chars: int = DEFAULT_MAX_KEY_CHARS,
    max_keyed_coefficients: int = DEFAULT_MAX_KEYED_COEFFICIENTS,
) -> str:
    """Fit the running job ``job_id`` and store its model (a k sweep: one per k), finishing the
    job in the same unit of work.

    ``worker_id`` is the worker that claimed the job (default: whichever the job names) and
    ``attempt`` the attempt it claimed (default: the current one); a job that meanwhile went to
    another worker or attempt is left alone, and the process exits as soon as its heartbeat
    finds that out (``EXIT_ATTEMPT_SUPERSEDED``). The heartbeat starts before the data are
    loaded, so a slow load never looks like a lost worker. ``worker_alive`` is the read end of
    a pipe held open by the worker process; the fit stops when it closes. ``data_loaded`` is set
    once the data are loaded (the worker's time limit counts from then). A keyed job's shard
    claimed by a process whose heartbeat is older than ``stale_after_s`` (seconds, on the
    database's clock) is claimed again. ``log_format``, when given, configures the logging of
    this process (a fit process does not inherit its worker's); every line logged during the
    fit names ``job_id``. A keyed job's global model is fitted on at most ``keyed_global_rows``
    rows drawn at random (``MIXREG_KEYED_GLOBAL_ROWS``), and refused (failed) if a key is longer
    than ``max_key_chars`` or its keys' lines would hold more than ``max_keyed_coefficients``
    coefficients (:class:`KeyedLimits`). Returns the status the
    job was left in by this call (``"lost"`` if the job was not, or stopped being, owned by the
    worker that claimed it).
    """
    return _in_fit_process(
        job_id,
        database_url,
        log_format,
        lambda session_factory: _run_job(
            session_factory,
            job_id,
            heartbeat_interval_s=heartbeat_interval_s,
            progress_interval_s=progress_interval_s,
            worker_id=worker_id,
            attempt=attempt,
            worker_alive=worker_alive,
            data_loaded=data_loaded,
            stale_after_s=stale_after_s,
            keyed_global_rows=keyed_global_rows,
            keyed_limits=KeyedLimits(max_key_chars, max_keyed_coefficients),
        ),
    )


@dataclass(frozen=True)
class _Attempt:
    """Who runs the job: the worker that claimed it and its attempt number."""

    worker_id: str
    attempt: int


@dataclass(frozen=True)
class _ClaimedJob:
    worker_id: str
    attempt: int
    dataset_id: str
    name: str | None
    spec: FitSpec
    data: TrainHoldout
    feature_names: list[str]
    registered_model: str | None
    keyed: KeyedData | None = None


def _current_attempt(
    session_factory: sessionmaker[Session], job_id: str, worker_id: str | None, attempt: int | None
) -> _Attempt | None:
    """The running attempt at ``job_id``, if it is the one asked for (any, for None)."""
    with read_scope(session_factory) as session:
        job = job_store.get_job(session, job_id=job_id)
        if job is None or job.status != "running" or job.worker_id is None:
            return None
        if worker_id is not None and job.worker_id != worker_id:
            return None
        if attempt is not None and job.attempts != attempt:
            return None
        return _Attempt(job.worker_id, job.attempts)


def _load_claimed_job(
    session_factory: sessionmaker[Session], job_id: str, owner: _Attempt, keyed_global_rows: int
) -> _ClaimedJob | None:
    """Read the job's spec and split its dataset (a keyed job: the rows of its global model,
    :func:`keyed_global_sample`); None if the attempt is no longer current.

    One read transaction (a snapshot, no write lock on SQLite), so the heartbeat and every
    other writer go on while the data are read.
    """
    with read_scope(session_factory) as session:
        job = job_store.get_job(session, job_id=job_id)
        if job is None or (job.status, job.worker_id, job.attempts) != (
            "running",
            owner.worker_id,
            owner.attempt,
        ):
            return None
        dataset = dataset_store.get_dataset(session, dataset_id=job.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {job.dataset_id} of job {job_id} is gone")
        spec = FitSpec.of_job(job)
        if job.split_by is not None:
            keyed = KeyedData.of_job(job)
            # A keyed fit takes neither weights, groups nor gating (service.fit_schemas).
            rows, held = keyed_global_sample(
                dataset.n_rows, spec.holdout_fraction, spec.seed, keyed_global_rows
            )
            X, y, _ = dataset_store.read_dataset_rows(
                session, dataset=dataset, rows=rows, column=keyed.split_by
            )
            del rows
            data = TrainHoldout(X[~held], y[~held], X[held], y[held])
            del X, y
        else:
            keyed, data = None, _load_split(session, dataset, spec)
        return _ClaimedJob(
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            dataset_id=job.dataset_id,
            name=job.name,
            spec=spec,
            data=data,
            feature_names=list(dataset.feature_names),
            registered_model=job.registered_model,
            keyed=keyed,
        )


def _load_split(session: Session, dataset: Dataset, spec: FitSpec) -> TrainHoldout:
    """Every row of ``dataset`` split by ``spec``, with the columns the fit uses."""
    wanted = wanted_columns(spec.weights_column, spec.groups_column)
    columns = load_columns(dataset, wanted)
    check_values(columns, wanted)
    data = TrainHoldout.of_blocks(
        dataset_store.iter_dataset_blocks(session, dataset=dataset),
        n_rows=dataset.n_rows,
        n_features=dataset.n_features,
        spec=spec,
        weights=columns.get(WEIGHTS),
        groups=columns.get(GROUPS),
    )
    if spec.concomitant_names is None:
        return data
    gate_columns = dataset_store.load_dataset_columns(dataset, spec.concomitant_names)
    Z = np.column_stack([gate_columns[name] for name in spec.concomitant_names])
    check_concomitant_values(Z, spec.concomitant_names)
    return data.with_concomitant(Z, spec)


def _run_job(
    session_factory: sessionmaker[Session],
    job_id: str,
    *,
    heartbeat_interval_s: float,
    progress_interval_s: float,
    worker_id: str | None,
    attempt: int | None,
    worker_alive: Connection | None,
    data_loaded: EventType | None,
    stale_after_s: float,
    keyed_global_rows: int,
    keyed_limits: KeyedLimits,
) -> str:
    owner = _current_attempt(session_factory, job_id, worker_id, attempt)
    if owner is None:
        return "lost"
    heartbeat = Heartbeat(
        session_factory,
        job_id=job_id,
        worker_id=owner.worker_id,
        attempt=owner.attempt,
        interval_s=heartbeat_interval_s,
        worker_alive=worker_alive,
    )
    with heartbeat:
        try:
            claimed = _load_claimed_job(session_factory, job_id, owner, keyed_global_rows)
        except InvalidInputError as exc:
            heartbeat.stop()
            return _finish_unfitted(session_factory, job_id, owner, "failed", exc.detail)
        if claimed is None:
            return "lost"
        if data_loaded is not None:
            data_loaded.set()
        progress = JobProgress(
            session_factory,
            job_id=job_id,
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            interval_s=progress_interval_s,
        )
        error: str | None = None
        spec, data = claimed.spec, claimed.data
        logger.info(
            "fitting %s with k=%s on %d training rows of %d features in process %d",
            spec.algorithm,
            ",".join(map(str, spec.all_n_components)),
            len(data.y_train),
            data.n_features,
            os.getpid(),
        )
        try:
            if (keyed_data := claimed.keyed) is None:
                fitted, keyed = fit_split(data, spec, progress=progress), None
            else:
                with ShardStore(
                    session_factory,
                    job_id=job_id,
                    worker_id=owner.worker_id,
                    stale_after_s=stale_after_s,
                    heartbeat_interval_s=heartbeat_interval_s,
                    worker_alive=worker_alive,
                ) as shards:
                    fitted, keyed = fit_keyed(
                        data,
                        keyed_data,
                        spec,
                        shards,
                        read_keys=lambda: key_blocks(session_factory, keyed_data),
                        read_rows=lambda rows: read_keyed_rows(session_factory, keyed_data, rows),
                        wait_s=progress_interval_s or heartbeat_interval_s,
                        progress=progress,
                        limits=keyed_limits,
                    )
        except JobLostError:
            return "lost"
        except FitCancelledError:
            status = "cancelled"
        except InvalidInputError as exc:
            status, error = "failed", exc.detail
        except ValueError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:
            logger.exception("job %s: the fit raised", job_id)
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            heartbeat.stop()
            heartbeat.exit_if_worker_gone()
            try:
                _store_models(session_factory, job_id, claimed, fitted, keyed)
            except JobLostError:
                return "lost"
            return "succeeded"
        heartbeat.stop()
        return _finish_unfitted(session_factory, job_id, owner, status, error)


def _finish_unfitted(
    session_factory: sessionmaker[Session],
    job_id: str,
    owner: _Attempt,
    status: str,
    error: str | None,
) -> str:
    """End the job of attempt ``owner`` without a model (``failed`` with ``error``, or
    ``cancelled``); return its status, or ``lost`` if the attempt is no longer current."""
    with session_scope(session_factory) as session:
        finished = job_store.finish_job(
            session,
            job_id=job_id,
            worker_id=owner.worker_id,
            attempt=owner.attempt,
            status=status,
            error=error,
            now=database_now(session),
        )
        if finished:
            job_store.discard_job_data(session, job_id=job_id)
    return status if finished else "lost"


def _store_models(
    session_factory: sessionmaker[Session],
    job_id: str,
    claimed: _ClaimedJob,
    fitted: FittedSweep,
    keyed: dict[str, Any] | None = None,
) -> None:
    """Store the model of every k (of a keyed fit: the global model and every key's lines in
    chunks) and finish the job together; roll all back if the job was taken away."""
    spec = claimed.spec
    with session_scope(session_factory) as session:
        model_ids: dict[int, str] = {}
        for fit in fitted.fits:
            model_ids[fit.n_components] = model_store.create_model(
                session,
                model_store.ModelRecord(
                    job_id=job_id,
                    dataset_id=claimed.dataset_id,
                    name=claimed.name,
                    algorithm=spec.algorithm,
                    n_components=fit.n_components,
                    n_features=claimed.data.n_features,
                    feature_names=claimed.feature_names,
                    fit_intercept=spec.fit_intercept,
                    params=fit.params,
                    seed=spec.seed,
                    coef=fit.coef,
                    intercept=fit.intercept,
                    shares=fit.shares,
                    train_min_loss=fit.train_min_loss,
                    holdout_min_loss=fit.holdout_min_loss,
                    baseline=fit.baseline,
                    n_train=fit.n_train,
                    n_holdout=fit.n_holdout,
                    loss_history=fit.loss_history,
                    n_iter=fit.n_iter,
                    fit_seconds=fit.fit_seconds,
                    converged=fit.converged,
                    log_likelihood=fit.score.log_likelihood,
                    bic=fit.score.bic,
                    n_parameters=fit.score.n_parameters,
                    candidates=fit.candidates,
                    warnings=fit.warnings,
                    weights_column=spec.weights_column,
                    groups_column=spec.groups_column,
                    group_labels=fit.group_labels,
                    group_lines=fit.group_lines,
                    group_posteriors=fit.group_posteriors,
                    group_metrics=fit.group_metrics,
                    uncertainty=fit.uncertainty,
                    gate=fit.gate,
                    split_by=None if claimed.keyed is None else claimed.keyed.split_by,
                    keyed_summary=keyed,
                ),
            ).id
        if keyed is not None:
            shard_store.publish_job_shards(
                session, job_id=job_id, model_id=model_ids[spec.n_components]
            )
            job_store.record_keyed_summary(session, job_id=job_id, summary=keyed)
        if spec.k_values is None:
            sweep, job_warnings = None, fitted.best.warnings
        else:
            sweep = sweep_record(fitted, model_ids)
            job_warnings = [
                f"k={fit.n_components}: {warning}"
                for fit in fitted.fits
                for warning in fit.warnings
            ]
        if claimed.registered_model is not None:
            registry.create_version(
                session,
                name=claimed.registered_model,
                model_id=model_ids[fitted.best_n_components],
            )
        if not job_store.finish_job(
            session,
            job_id=job_id,
            worker_id=claimed.worker_id,
            attempt=claimed.attempt,
            status="succeeded",
            model_id=model_ids[fitted.best_n_components],
            sweep=sweep,
            warnings=job_warnings,
            best_loss=fitted.best.train_min_loss,
            now=database_now(session),
        ):
            raise JobLostError(job_id)
        job_store.discard_job_data(session, job_id=job_id)


def run_shards(
    job_id: str,
    database_url: str,
    *,
    worker_id: str,
    heartbeat_interval_s: float = 1.0,
    stale_after_s: float = 15.0,
    worker_alive: Connection | None = None,
    log_format: LogFormat | None = None,
) -> int:
    """Fit shards of the keyed job ``job_id`` beside the process that runs the job: claim a
    free (or stale) shard, read only its rows from the dataset, fit and store it; until no
    shard is free. Returns how many shards this call stored.

    Runs in a child process of a worker (``worker_id``); memory holds one shard's rows and one
    chunk of the dataset. Stops (storing nothing more) when the job is finished or being
    cancelled, and exits when ``worker_alive`` closes (its worker died): its claim goes stale
    and another claimant fits the shard.
    """
    return _in_fit_process(
        job_id,
        database_url,
        log_format,
        lambda session_factory: fit_free_shards(
            session_factory,
            job_id,
            worker_id=worker_id,
            heartbeat_interval_s=heartbeat_interval_s,
            stale_after_s=stale_after_s,
            worker_alive=worker_alive,
        ),
    )


def _in_fit_process(
    job_id: str,
    database_url: str,
    log_format: LogFormat | None,
    run: Callable[[sessionmaker[Session]], Result],
) -> Result:
    """The entry of a fit process: configure its logging (``log_format``; a fit process does
    not inherit its worker's), open its own engine on ``database_url``, and call ``run`` with
    a session factory, every line logged meanwhile naming ``job_id``."""
    if log_format is not None:
        configure_logging(log_format)
    engine = make_engine(database_url)
    try:
        with job_context(job_id):
            return run(make_sessionmaker(engine))
    finally:
        engine.dispose()
