"""The Procrastinate queue of fit jobs, seen from the processes that write jobs.

With ``MIXREG_WORKER=procrastinate`` every fit job is carried by one Procrastinate task,
``mixreg.fit``, whose only argument is the job id; ``mixreg worker`` processes run it (see
:mod:`service.jobs.procrastinate_worker`). The task is deferred, and a cancellation's abort
requested, on the connection of the caller's SQLAlchemy session, so the job row and its task
are committed (or rolled back) together: a row that says "queued" always has its task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import procrastinate
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from models_store import jobs as job_store

FIT_TASK = "mixreg.fit"
"""Name of the Procrastinate task that runs a fit job; its one argument is ``job_id``."""

SHARDS_TASK = "mixreg.fit_shards"
"""Name of the Procrastinate task that fits free shards of a keyed job beside the worker that
runs the job; its one argument is ``job_id``."""

FIT_QUEUE = "fits"
"""The Procrastinate queue the fit tasks go to and ``mixreg worker`` listens on."""


def libpq_conninfo(database_url: str) -> str:
    """The libpq URL of a SQLAlchemy PostgreSQL URL (``postgresql+psycopg://`` →
    ``postgresql://``), for psycopg connections made outside SQLAlchemy."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


def _driver_connection(session: Session) -> Any:
    """The psycopg connection under ``session``, inside the session's transaction."""
    return session.connection().connection.driver_connection


@dataclass(frozen=True)
class QueueSummary:
    """Procrastinate's view of the fit queue."""

    workers: int
    """``mixreg worker`` processes whose heartbeat is recent."""
    waiting: int
    """Tasks waiting for a worker."""


class FitTaskQueue:
    """Defers fit tasks and requests their abort in the caller's unit of work."""

    def __init__(self) -> None:
        # Every operation runs on the caller's connection, so this app never opens a pool.
        self._app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector())

    def enqueue(self, session: Session, job_id: str) -> int:
        """Defer the task of the queued job ``job_id`` in ``session``'s transaction and record
        its id on the job; return the task id."""
        task_id = self._app.configure_task(
            FIT_TASK, queue=FIT_QUEUE, connection=_driver_connection(session)
        ).defer(job_id=job_id)
        job_store.set_task_id(session, job_id=job_id, task_id=task_id)
        return task_id

    def enqueue_shards(self, session: Session, job_id: str, count: int) -> None:
        """Defer ``count`` tasks that fit free shards of the running keyed job ``job_id``, in
        ``session``'s transaction: each runs on whichever worker has a free slot and fits
        shards until none is free."""
        task = self._app.configure_task(
            SHARDS_TASK, queue=FIT_QUEUE, connection=_driver_connection(session)
        )
        for _ in range(count):
            task.defer(job_id=job_id)

    def abort(self, session: Session, task_id: int) -> bool:
        """Cancel a waiting task, or ask the worker running it to abort, in ``session``'s
        transaction; False if the task already ended."""
        return self._app.job_manager.cancel_job_by_id(
            task_id, abort=True, connection=_driver_connection(session)
        )

    @staticmethod
    def summary(session: Session, *, stale_after_s: float) -> QueueSummary | None:
        """Live workers and waiting tasks; None if the queue's schema is missing."""
        counts = job_store.task_queue_summary(session, queue=FIT_QUEUE, stale_after_s=stale_after_s)
        return None if counts is None else QueueSummary(workers=counts[0], waiting=counts[1])
