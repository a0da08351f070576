"""The SQL of the jobs' lifecycle: created, claimed, heartbeated, their progress written,
cancelled, finished, reaped when stale, released, and deleted with the data they asked to
discard. Every state change is a compare-and-set on the job's owner and attempt.

Functions take the session first and everything else by keyword, flush but never commit
(:mod:`models_store.common`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    case,
    delete,
    false,
    func,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from models_store.base import UTCDateTime
from models_store.codecs import (
    to_json_value,
)
from models_store.common import (
    UNFINISHED_JOB_STATUSES,
    PageKey,
    count_rows,
    execute_counting,
    idempotency_scope,
    is_id,
    new_id,
    newest_first,
    utcnow,
)
from models_store.datasets import delete_dataset, lock_dataset, unfinished_jobs_of_dataset
from models_store.shards import delete_shards_if_finished
from models_store.tables import (
    TERMINAL_JOB_STATUSES,
    Dataset,
    Job,
)


def _update_job(
    session: Session, job_id: str, *conditions: ColumnElement[bool], **values: Any
) -> bool:
    """Apply ``values`` to the job if it still meets ``conditions``; True if it did.

    The conditions make each state change a compare-and-set, so a worker that lost its job
    (requeued, claimed by another, finished) cannot overwrite it.
    """
    statement = update(Job).where(Job.id == job_id, *conditions).values(**values)
    changed = execute_counting(session, statement) == 1
    cached = session.identity_map.get(Session.identity_key(Job, job_id))
    if cached is not None:
        session.expire(cached)
    if changed and "status" in values:
        # However a job ends (failed, cancelled, reaped, released), in the transaction that
        # ends it: nothing else would ever read a finished job's shards again.
        delete_shards_if_finished(session, job_id)
    return changed


def discard_job_data(session: Session, *, job_id: str) -> bool:
    """Delete the dataset of the finished job ``job_id`` if the job asked for it
    (``discard_data``) and no unfinished job uses it; True if it was deleted."""
    job = session.get(Job, job_id)
    if job is None or not job.discard_data or job.status not in TERMINAL_JOB_STATUSES:
        return False
    if lock_dataset(session, dataset_id=job.dataset_id, shared=False) is None:
        return False
    if unfinished_jobs_of_dataset(session, dataset_id=job.dataset_id):
        return False
    return delete_dataset(session, dataset_id=job.dataset_id)


def discard_finished_job_data(session: Session) -> list[str]:
    """Delete the datasets of finished jobs that asked for it (``discard_data``) and that no
    unfinished job uses; return their ids."""
    unfinished = select(Job.dataset_id).where(Job.status.in_(UNFINISHED_JOB_STATUSES))
    doomed = list(
        session.scalars(
            select(Dataset.id)
            .where(
                Dataset.id.in_(
                    select(Job.dataset_id).where(
                        Job.discard_data.is_(True), Job.status.in_(TERMINAL_JOB_STATUSES)
                    )
                ),
                Dataset.id.not_in(unfinished),
            )
            .with_for_update(skip_locked=True)
        )
    )
    return [dataset_id for dataset_id in doomed if delete_dataset(session, dataset_id=dataset_id)]


def delete_finished_jobs(session: Session, *, finished_before: datetime) -> int:
    """Delete the jobs that finished before ``finished_before``; return how many. Their models
    stay (with no job)."""
    return execute_counting(
        session,
        delete(Job).where(Job.status.in_(TERMINAL_JOB_STATUSES), Job.finished_at < finished_before),
    )


@dataclass(frozen=True)
class JobRecord:
    """A fit to queue, as its job stores it: each field is the column of the same name.

    ``params`` are the validated algorithm parameters. ``k_values`` makes the job a k sweep
    (one model per k); ``n_components`` is then the largest of them. ``api_key_id`` is the key
    that submitted it (None without keys); an ``idempotency_key`` is unique among that
    caller's jobs. ``registered_model`` names the registered model whose next version the fit
    becomes. ``discard_data`` deletes the dataset once the job is finished. ``weights_column``
    and ``groups_column`` name the dataset columns of the row weights and group labels.
    ``uncertainty`` holds the standard errors and bootstrap the fit computes
    (``standard_errors``, ``n_bootstrap``, ``bootstrap``). ``gating`` asks for a gate:
    ``"features"`` or the names of the dataset's extra columns it reads. ``split_by`` makes it
    a keyed fit (a mixture per value of that dataset column); ``small_keys`` says what keys too
    small for k lines get.
    """

    dataset_id: str
    algorithm: str
    n_components: int
    params: Mapping[str, Any]
    fit_intercept: bool
    holdout_fraction: float
    max_attempts: int
    seed: int | None = None
    time_budget_s: float | None = None
    name: str | None = None
    api_key_id: str | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    k_values: Sequence[int] | None = None
    registered_model: str | None = None
    discard_data: bool = False
    weights_column: str | None = None
    groups_column: str | None = None
    uncertainty: Mapping[str, Any] | None = None
    gating: str | Sequence[str] | None = None
    split_by: str | None = None
    small_keys: str | None = None
    keys_per_shard: int | None = None


def create_job(session: Session, record: JobRecord) -> Job:
    """Queue the fit ``record``. Raises ``ValueError`` if it allows no attempt."""
    if record.max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {record.max_attempts}")
    columns = {field.name: getattr(record, field.name) for field in fields(record)}
    columns.update(
        k_values=None if record.k_values is None else [int(k) for k in record.k_values],
        params=to_json_value(dict(record.params)),
        idempotency_scope=(
            None if record.idempotency_key is None else idempotency_scope(record.api_key_id)
        ),
        discard_data=record.discard_data or None,
        uncertainty=None if record.uncertainty is None else to_json_value(dict(record.uncertainty)),
        gating=(
            record.gating
            if record.gating is None or isinstance(record.gating, str)
            else list(record.gating)
        ),
    )
    job = Job(
        id=new_id(),
        status="queued",
        attempts=0,
        cancel_requested=False,
        progress_fraction=0.0,
        created_at=utcnow(),
        warnings=[],
        **columns,
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, *, job_id: str) -> Job | None:
    """Return the job with this id, or None."""
    return session.get(Job, job_id) if is_id(job_id) else None


def count_unfinished_jobs(session: Session, *, api_key_id: str | None) -> int:
    """Jobs queued or running that the API key ``api_key_id`` submitted (None: without a key)."""
    owner = Job.api_key_id.is_(None) if api_key_id is None else Job.api_key_id == api_key_id
    query = select(Job.id).where(Job.status.in_(("queued", "running")), owner)
    return count_rows(session, query)


def lock_job_quota(session: Session, *, api_key_id: str | None) -> None:
    """Hold, until the transaction ends, the lock under which the unfinished jobs of
    ``api_key_id`` are counted and a new one inserted, so that concurrent submissions cannot
    together exceed the quota.

    PostgreSQL: a transaction-level advisory lock per key. SQLite has one writer at a time: an
    empty write takes that lock (a no-op if the transaction already holds it).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
            {"name": f"mixreg-job-quota:{api_key_id or ''}"},
        )
    else:
        session.execute(update(Job).where(false()).values(status=Job.status))


def get_job_by_idempotency_key(session: Session, *, api_key_id: str | None, key: str) -> Job | None:
    """Return the job the caller ``api_key_id`` (None: without a key) created with this
    ``Idempotency-Key``, or None."""
    query = select(Job).where(
        Job.idempotency_scope == idempotency_scope(api_key_id), Job.idempotency_key == key
    )
    return session.scalars(query).one_or_none()


def list_jobs(
    session: Session,
    *,
    status: str | None,
    limit: int,
    offset: int,
    after: PageKey | None = None,
) -> tuple[list[Job], int]:
    """Return a page of jobs (optionally only those in ``status``), newest first (after the
    row ``after``), and the total."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    return newest_first(session, query, Job, limit=limit, offset=offset, after=after)


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


def any_queued_job(session: Session) -> bool:
    """Whether some job waits in the queue (a cheap look before :func:`claim_next_job`)."""
    return session.scalar(select(select(Job.id).where(Job.status == "queued").exists())) is True


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


def _owned_by(worker_id: str, attempt: int | None = None) -> tuple[ColumnElement[bool], ...]:
    owned = (Job.status == "running", Job.worker_id == worker_id)
    # A worker may claim a job again after the reaper took it away: only the current attempt
    # is the worker's own.
    return owned if attempt is None else (*owned, Job.attempts == attempt)


def heartbeat(
    session: Session, *, job_id: str, worker_id: str, now: datetime, attempt: int | None = None
) -> bool:
    """Record that ``worker_id`` still runs ``job_id`` (in its attempt ``attempt``, if given);
    False if the job, or that attempt, is no longer its own."""
    return _update_job(session, job_id, *_owned_by(worker_id, attempt), heartbeat_at=now)


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
    attempt: int | None = None,
    keys_done: int | None = None,
    n_keys: int | None = None,
) -> bool:
    """Record progress (which also counts as a heartbeat); False if the job (or its attempt
    ``attempt``, if given) is not owned.

    ``n_components`` is the k being fitted (of a k sweep); a keyed fit counts ``keys_done`` of
    its ``n_keys`` keys.
    """
    keyed = {} if n_keys is None else {"keys_done": keys_done, "n_keys": n_keys}
    return _update_job(
        session,
        job_id,
        *_owned_by(worker_id, attempt),
        **keyed,
        progress_fraction=fraction,
        progress_iteration=iteration,
        progress_candidates=candidates,
        progress_best_loss=best_loss,
        progress_n_components=n_components,
        heartbeat_at=now,
    )


def request_cancel(session: Session, *, job_id: str, now: datetime | None = None) -> Job | None:
    """Cancel a job: a queued job is cancelled at once, a running one is flagged for its worker.

    One conditional statement does both, so no state change can slip in between a look at the
    job's status and the write (a requeue of the running job would otherwise lose the cancel).
    A finished job is returned unchanged; None if there is no such job.
    """
    if not is_id(job_id):
        return None
    now = now or utcnow()
    queued = Job.status == "queued"
    _update_job(
        session,
        job_id,
        Job.status.in_(("queued", "running")),
        cancel_requested=True,
        status=case((queued, "cancelled"), else_=Job.status),
        finished_at=case((queued, literal(now, UTCDateTime())), else_=Job.finished_at),
    )
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
    attempt: int | None = None,
    best_loss: float | None = None,
) -> bool:
    """Move a running job owned by ``worker_id`` (in its attempt ``attempt``, if given) to a
    terminal ``status``.

    ``sweep`` is the result of a k sweep, ``warnings`` what the fit found poor, ``best_loss``
    the training min-loss of the model the job chose (its progress showed the search's until
    then). Returns False
    if the job was taken away meanwhile (requeued by the reaper, or claimed by another
    worker or again), in which case nothing is written.
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
    if best_loss is not None:
        values["progress_best_loss"] = best_loss
    return _update_job(session, job_id, *_owned_by(worker_id, attempt), **values)


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


@dataclass(frozen=True)
class _StaleJob:
    job_id: str
    heartbeat_at: datetime
    attempts: int
    max_attempts: int
    cancel_requested: bool


def _stale_running_jobs(
    session: Session,
    *,
    stale_before: datetime,
    job_id: str | None = None,
    alive: Sequence[str] = (),
) -> list[_StaleJob]:
    """Running jobs (or just ``job_id``) whose heartbeat is older than ``stale_before``, but
    for those in ``alive``, locked, oldest first; on PostgreSQL rows another recoverer holds
    are skipped."""
    query = select(
        Job.id, Job.heartbeat_at, Job.attempts, Job.max_attempts, Job.cancel_requested
    ).where(Job.status == "running", Job.heartbeat_at < stale_before)
    if job_id is not None:
        query = query.where(Job.id == job_id)
    if alive:
        query = query.where(Job.id.not_in(list(alive)))
    rows = session.execute(
        query.order_by(Job.created_at, Job.id).with_for_update(skip_locked=True)
    ).all()
    stale: list[_StaleJob] = []
    for row_id, heartbeat_at, attempts, max_attempts, cancel_requested in rows:
        assert heartbeat_at is not None  # selected by heartbeat_at < stale_before
        stale.append(_StaleJob(row_id, heartbeat_at, attempts, max_attempts, cancel_requested))
    return stale


def _recover_stale(session: Session, job: _StaleJob, *, now: datetime) -> str | None:
    """Recover one running job whose heartbeat went stale: back to the queue with attempts
    left, failed "worker lost" without, cancelled if that was requested.

    Conditional on the heartbeat read, so a worker that beat in between keeps its job. Returns
    the job's new status, or None if it was not changed.
    """
    still_stale = (Job.status == "running", Job.heartbeat_at == job.heartbeat_at)
    values: dict[str, Any]
    if job.cancel_requested:
        values = {"status": "cancelled", "finished_at": now}
    elif job.attempts < job.max_attempts:
        # A cancel requested since the read above wins: the flag is looked at in the statement.
        values = {
            **_BACK_IN_QUEUE,
            "status": case((Job.cancel_requested, "cancelled"), else_="queued"),
            "finished_at": case((Job.cancel_requested, literal(now, UTCDateTime())), else_=None),
        }
    else:
        values = {
            "status": "failed",
            "finished_at": now,
            "error": (
                f"worker lost: no heartbeat since {job.heartbeat_at.isoformat()}; "
                f"gave up after {job.attempts} attempts"
            ),
        }
    if not _update_job(session, job.job_id, *still_stale, **values):
        return None
    return session.scalar(select(Job.status).where(Job.id == job.job_id))


def requeue_stale_jobs(
    session: Session, *, stale_before: datetime, now: datetime, alive: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """Recover running jobs whose last heartbeat is older than ``stale_before``, but for the
    jobs in ``alive`` (the caller's own fits, whose processes it sees running).

    A job with attempts left goes back to the queue; one that used all its attempts fails with
    a "worker lost" error; one whose cancellation was requested is cancelled. Returns the ids
    of the requeued and of the failed jobs.
    """
    requeued: list[str] = []
    failed: list[str] = []
    for job in _stale_running_jobs(session, stale_before=stale_before, alive=alive):
        status = _recover_stale(session, job, now=now)
        if status == "queued":
            requeued.append(job.job_id)
        elif status == "failed":
            failed.append(job.job_id)
    return requeued, failed


def recover_stale_job(
    session: Session, *, job_id: str, stale_before: datetime, now: datetime
) -> str | None:
    """Recover ``job_id`` as :func:`requeue_stale_jobs` would, if it is a running job whose
    heartbeat is older than ``stale_before``; return its new status, or None if unchanged."""
    if not is_id(job_id):
        return None
    stale = _stale_running_jobs(session, stale_before=stale_before, job_id=job_id)
    return _recover_stale(session, stale[0], now=now) if stale else None


def release_job(session: Session, *, job_id: str, worker_id: str, now: datetime) -> str | None:
    """Hand back ``job_id``, run by ``worker_id``, which is shutting down cleanly.

    The job returns to the queue at once, and the attempt it was on is not counted: the
    worker stopped it on purpose. A job whose cancellation was requested is cancelled instead.
    Returns the job's new status (``queued`` or ``cancelled``), or None if the job was not
    running for ``worker_id``.
    """
    owned = session.execute(
        select(Job.cancel_requested)
        .where(Job.id == job_id, *_owned_by(worker_id))
        .with_for_update()
    ).first()
    if owned is None:
        return None
    if owned.cancel_requested:
        values: dict[str, Any] = {"status": "cancelled", "finished_at": now}
    else:
        values = {"attempts": Job.attempts - 1, **_BACK_IN_QUEUE}
    if not _update_job(session, job_id, *_owned_by(worker_id), **values):
        return None
    return str(values["status"])


def release_jobs(session: Session, *, worker_id: str, now: datetime) -> list[str]:
    """Hand back every running job of ``worker_id`` (see :func:`release_job`).

    Returns the ids of the requeued jobs.
    """
    owned = session.scalars(
        select(Job.id).where(*_owned_by(worker_id)).order_by(Job.created_at, Job.id)
    ).all()
    return [
        job_id
        for job_id in owned
        if release_job(session, job_id=job_id, worker_id=worker_id, now=now) == "queued"
    ]


def set_task_id(session: Session, *, job_id: str, task_id: int) -> None:
    """Record the Procrastinate job that carries ``job_id``."""
    _update_job(session, job_id, task_id=task_id)


def queued_jobs_without_task(session: Session) -> list[str]:
    """Ids of queued jobs that no Procrastinate job carries (queued by an embedded-mode
    process), oldest first."""
    return list(
        session.scalars(
            select(Job.id)
            .where(Job.status == "queued", Job.task_id.is_(None))
            .order_by(Job.created_at, Job.id)
            .with_for_update(skip_locked=True)
        )
    )


def task_queue_summary(
    session: Session, *, queue: str, stale_after_s: float
) -> tuple[int, int] | None:
    """Procrastinate's view of ``queue`` (PostgreSQL): the workers whose heartbeat is younger
    than ``stale_after_s`` and the tasks waiting; None if its schema is not installed."""
    if session.scalar(text("SELECT to_regclass('procrastinate_jobs')")) is None:
        return None
    workers = session.scalar(
        text(
            "SELECT count(*) FROM procrastinate_workers "
            "WHERE last_heartbeat > now() - make_interval(secs => :seconds)"
        ),
        {"seconds": stale_after_s},
    )
    waiting = session.scalar(
        text(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = :queue AND status = 'todo'"
        ),
        {"queue": queue},
    )
    return int(workers or 0), int(waiting or 0)


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


def record_keyed_summary(session: Session, *, job_id: str, summary: Mapping[str, Any]) -> None:
    """Record a keyed job's per-key counts, failures and min-loss quantiles; every key done."""
    n_keys = int(summary.get("n_keys", 0))
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(keyed_summary=to_json_value(dict(summary)), keys_done=n_keys, n_keys=n_keys)
    )
