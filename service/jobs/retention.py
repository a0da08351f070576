"""Retention: what the workers delete so that storage does not grow forever.

Every ``MIXREG_RETENTION_INTERVAL_S`` a worker (each embedded worker; of the ``mixreg worker``
processes, the one that holds the recovery lock) deletes

- the datasets of finished fits that asked not to keep their data (``keep_data: false``);
- the shards and shard claims of finished keyed jobs that an older version left behind (a job
  deletes its own when it ends);
- with ``MIXREG_JOB_RETENTION_DAYS``, jobs finished longer ago than that (their models stay);
- with ``MIXREG_MODEL_RETENTION_DAYS``, models stored longer ago that no alias points at;
- with ``MIXREG_DATASET_RETENTION_DAYS``, datasets uploaded longer ago that no unfinished job
  uses and no stored model was fitted on;
- with ``MIXREG_PREDICTION_LOG_RETENTION_DAYS`` (30 by default), logged predictions logged
  longer ago, and with ``MIXREG_OUTCOME_RETENTION_DAYS`` (365), outcomes posted longer ago:
  oldest first, ``MIXREG_LOG_DELETE_BATCH_ROWS`` rows per transaction, so that on SQLite
  the write lock is never held for more than one batch (predict never waits for it: the log
  is written by a background thread).

Each deletion is idempotent, so several processes doing it at once delete each row once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store import prediction_log, registry
from models_store import shards as shard_store
from models_store.session import session_scope
from service.config import Settings

logger = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    """What one round deleted."""

    discarded_datasets: list[str] = field(default_factory=list)
    expired_jobs: int = 0
    expired_models: list[str] = field(default_factory=list)
    expired_datasets: list[str] = field(default_factory=list)
    finished_job_shards: int = 0
    expired_logged_rows: int = 0
    expired_outcomes: int = 0


def _days_ago(now: datetime, days: float | None) -> datetime | None:
    return None if days is None else now - timedelta(days=days)


def apply_retention(
    session_factory: sessionmaker[Session], settings: Settings, *, now: datetime
) -> RetentionReport:
    """Delete what the retention settings let go of (see the module docstring), each kind in
    a transaction of its own."""
    report = RetentionReport()
    with session_scope(session_factory) as session:
        report.discarded_datasets = job_store.discard_finished_job_data(session)
    with session_scope(session_factory) as session:
        report.finished_job_shards = shard_store.delete_finished_job_shards(session)
    jobs_before = _days_ago(now, settings.job_retention_days)
    if jobs_before is not None:
        with session_scope(session_factory) as session:
            report.expired_jobs = job_store.delete_finished_jobs(
                session, finished_before=jobs_before
            )
    models_before = _days_ago(now, settings.model_retention_days)
    if models_before is not None:
        with session_scope(session_factory) as session:
            for model_id in registry.models_not_behind_an_alias(
                session, created_before=models_before
            ):
                # An alias may have moved onto it since the list was read: lock the version,
                # then look again (see registry.lock_version_of_model).
                version = registry.lock_version_of_model(session, model_id=model_id)
                if version is not None and registry.aliases_of_version(
                    session, name=version.registered_model, version=version.version
                ):
                    continue
                if model_store.delete_model(session, model_id=model_id):
                    report.expired_models.append(model_id)
    datasets_before = _days_ago(now, settings.dataset_retention_days)
    if datasets_before is not None:
        with session_scope(session_factory) as session:
            report.expired_datasets = dataset_store.delete_unreferenced_datasets(
                session, created_before=datasets_before
            )
    log_before = _days_ago(now, settings.prediction_log_retention_days)
    if log_before is not None:
        report.expired_logged_rows = delete_in_batches(
            session_factory,
            prediction_log.delete_logged_before,
            before=log_before,
            batch_rows=settings.log_delete_batch_rows,
        )
    outcomes_before = _days_ago(now, settings.outcome_retention_days)
    if outcomes_before is not None:
        report.expired_outcomes = delete_in_batches(
            session_factory,
            prediction_log.delete_outcomes_before,
            before=outcomes_before,
            batch_rows=settings.log_delete_batch_rows,
        )
    _log(report)
    return report


def delete_in_batches(
    session_factory: sessionmaker[Session],
    delete_batch: Callable[..., int],
    *,
    before: datetime,
    batch_rows: int,
) -> int:
    """Run ``delete_batch`` (at most ``batch_rows`` rows older than ``before``) in one
    transaction after another until one deletes fewer; the rows deleted."""
    deleted = 0
    while True:
        with session_scope(session_factory) as session:
            in_batch = delete_batch(session, before=before, limit=batch_rows)
        deleted += in_batch
        if in_batch < batch_rows:
            return deleted


def _log(report: RetentionReport) -> None:
    if report.expired_logged_rows:
        logger.info("deleted %d expired logged prediction rows", report.expired_logged_rows)
    if report.expired_outcomes:
        logger.info("deleted %d expired outcomes", report.expired_outcomes)
    if report.finished_job_shards:
        logger.info("deleted %d shards of finished keyed jobs", report.finished_job_shards)
    if report.discarded_datasets:
        logger.info("deleted %d datasets of finished fits", len(report.discarded_datasets))
    if report.expired_jobs:
        logger.info("deleted %d expired jobs", report.expired_jobs)
    if report.expired_models:
        logger.info("deleted %d expired models no alias points at", len(report.expired_models))
    if report.expired_datasets:
        logger.info("deleted %d expired unused datasets", len(report.expired_datasets))
