"""The embedded job queue: a thread in the API process that runs queued jobs in child processes.

The ``jobs`` table is the queue. The worker claims jobs with a conditional update (so several
API processes on one PostgreSQL database never run a job twice), starts one child process per
job (at most ``worker_concurrency`` at once) that calls :func:`service.jobs.training.run_job`, and
watches its children: it stops a child whose job's cancellation was requested, kills one that
exceeds the job time limit, and fails the job of a child that died (the children are managed
by :class:`~service.jobs.supervisor.FitSupervisor`, shared with ``mixreg worker``). A reaper
requeues jobs whose heartbeat went stale, so the jobs of a killed server are retried after a
restart.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store.common import database_now, utcnow
from models_store.session import read_scope, session_scope
from service.config import Settings
from service.jobs.retention import apply_retention
from service.jobs.supervisor import FitSupervisor, RunningFit, new_worker_id
from service.metrics import ServiceMetrics

logger = logging.getLogger(__name__)


class EmbeddedWorker:
    """Claims queued jobs and runs each in its own child process."""

    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        settings: Settings,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.worker_id = new_worker_id()
        self._session_factory = session_factory
        self._settings = settings
        self._supervisor = FitSupervisor(
            session_factory=session_factory,
            settings=settings,
            worker_id=self.worker_id,
            metrics=metrics,
        )
        self._running: dict[str, RunningFit] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._next_reap = 0.0
        self._next_retention = 0.0
        self._thread = threading.Thread(target=self._loop, name="mixreg-worker", daemon=True)

    def start(self) -> None:
        """Start polling in a background thread."""
        self._thread.start()

    def wake(self) -> None:
        """Poll now instead of at the next interval (a job was just queued or cancelled)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop polling, end the running fits and put their jobs back in the queue at once.

        The interrupted attempts are not counted, so a clean restart costs a job nothing.
        """
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        for fit in list(self._running.values()):
            try:
                self._supervisor.hand_back(fit)
            except SQLAlchemyError:
                # The reaper of the next worker retries it once its heartbeat is stale.
                logger.exception("could not hand back job %s on shutdown", fit.job_id)
        self._running.clear()

    def _loop(self) -> None:
        try:
            self._supervisor.warm_up()
        except OSError:
            logger.exception("could not start the fork server; fits will retry starting it")
        while not self._stopping.is_set():
            try:
                self.run_once()
            except Exception:
                # A database hiccup must not end the worker; the next round retries.
                logger.exception("embedded worker round failed")
            self._wake.wait(self._settings.poll_interval_s)
            self._wake.clear()

    def run_once(self) -> None:
        """One round: collect exited fits, enforce cancel and time limits, reap, claim."""
        if self._running:
            # Reads take no write lock (SQLite): a round must not queue behind the writers.
            with read_scope(self._session_factory) as session:
                cancelled = set(
                    job_store.jobs_with_cancel_requested(session, worker_id=self.worker_id)
                )
            for fit in list(self._running.values()):
                if self._supervisor.check(fit, cancel_requested=fit.job_id in cancelled):
                    del self._running[fit.job_id]
        if time.monotonic() >= self._next_reap:
            self._reap_stale()
            self._next_reap = time.monotonic() + self._settings.heartbeat_interval_s
        if time.monotonic() >= self._next_retention:
            apply_retention(self._session_factory, self._settings, now=utcnow())
            self._next_retention = time.monotonic() + self._settings.retention_interval_s
        capacity = self._settings.worker_concurrency
        while not self._stopping.is_set() and len(self._running) < capacity:
            if not self._claim_and_start():
                break

    def _reap_stale(self) -> None:
        # This worker's own fits whose processes run are not lost, however late their
        # heartbeat (a process just started on a busy machine beats a moment later).
        alive = [job_id for job_id, fit in self._running.items() if fit.process.is_alive()]
        with session_scope(self._session_factory) as session:
            now = database_now(session)
            stale_before = now - timedelta(seconds=self._settings.stale_after_s)
            requeued, failed = job_store.requeue_stale_jobs(
                session, stale_before=stale_before, now=now, alive=alive
            )
        for job_id in requeued:
            logger.warning("job %s lost its worker; queued again", job_id)
        for job_id in failed:
            logger.warning("job %s lost its worker and has no attempts left; failed", job_id)

    def _claim_and_start(self) -> bool:
        # Most rounds find nothing queued: look first without the write lock (SQLite), which
        # every round would otherwise take and the API's writes would wait behind.
        with read_scope(self._session_factory) as session:
            if not job_store.any_queued_job(session):
                return False
        with session_scope(self._session_factory) as session:
            job = job_store.claim_next_job(
                session, worker_id=self.worker_id, now=database_now(session)
            )
            if job is None:
                return False
            job_id, algorithm, attempt = job.id, job.algorithm, job.attempts
        fit = self._supervisor.start(job_id, algorithm, attempt)
        if fit is not None:
            self._running[job_id] = fit
        return True
