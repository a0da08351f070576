"""The embedded job queue: a thread in the API process that runs queued jobs in child processes.

The ``jobs`` table is the queue. The worker claims jobs with a conditional update (so several
API processes on one PostgreSQL database never run a job twice), starts one child process per
job (at most ``worker_concurrency`` at once) that calls :func:`service.jobs.training.run_job`, and
watches its children: it stops a child whose job's cancellation was requested, kills one that
exceeds the job time limit, and fails the job of a child that died. A reaper requeues jobs
whose heartbeat went stale, so the jobs of a killed server are retried after a restart.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from models_store import repository
from models_store.session import session_scope
from service.api.metrics import ServiceMetrics
from service.config import Settings
from service.jobs.training import EXIT_PARENT_LOST, run_job

logger = logging.getLogger(__name__)

# How long a stopped child gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 1.0


def _now() -> datetime:
    return datetime.now(UTC)


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the fit process was killed by {name} before it finished the job"
    if exitcode == EXIT_PARENT_LOST:
        return "the fit process lost its worker before it finished the job"
    return f"the fit process exited with code {exitcode} before it finished the job"


@dataclass
class _RunningFit:
    job_id: str
    algorithm: str
    process: BaseProcess
    started: float
    # Held open while the fit runs; the child sees end of file if this process dies.
    alive_writer: Connection


class EmbeddedWorker:
    """Claims queued jobs and runs each in its own child process."""

    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        settings: Settings,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._session_factory = session_factory
        self._settings = settings
        self._metrics = metrics
        self._context = multiprocessing.get_context("forkserver")
        # The fork server imports the fit code once; each fit then starts in milliseconds
        # instead of re-importing scikit-learn, and no process is forked from this threaded one.
        # A child also re-runs the server's main script (`mixreg` or `uvicorn`), whose imports
        # service.cli covers.
        self._context.set_forkserver_preload(["service.jobs.training", "service.cli"])
        self._running: dict[str, _RunningFit] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._next_reap = 0.0
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
            self._end_process(fit)
        self._running.clear()
        try:
            with session_scope(self._session_factory) as session:
                released = repository.release_jobs(session, worker_id=self.worker_id, now=_now())
        except SQLAlchemyError:
            # The reaper of the next worker retries them once their heartbeat is stale.
            logger.exception("could not hand back the running jobs on shutdown")
            return
        for job_id in released:
            logger.info("job %s queued again on shutdown", job_id)

    def _loop(self) -> None:
        try:
            self._warm_up()
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

    def _warm_up(self) -> None:
        """Start the fork server and wait until it has imported the fit code (seconds), so
        that the first fit does not wait for it."""
        process = self._context.Process(target=os.getpid, name="mixreg-fork-server-warm-up")
        process.start()
        process.join()

    def run_once(self) -> None:
        """One round: collect exited fits, enforce cancel and time limits, reap, claim."""
        self._collect_exited()
        if self._running:
            self._stop_cancelled()
            self._stop_overdue()
        if time.monotonic() >= self._next_reap:
            self._reap_stale()
            self._next_reap = time.monotonic() + self._settings.heartbeat_interval_s
        capacity = self._settings.worker_concurrency
        while not self._stopping.is_set() and len(self._running) < capacity:
            if not self._claim_and_start():
                break

    def _collect_exited(self) -> None:
        for fit in list(self._running.values()):
            if fit.process.is_alive():
                continue
            fit.process.join()
            fit.alive_writer.close()
            del self._running[fit.job_id]
            status = self._fail_if_still_running(fit, _describe_exit(fit.process.exitcode))
            self._observe(fit, status)

    def _fail_if_still_running(self, fit: _RunningFit, error: str) -> str:
        """Fail the job of a fit that ended without finishing it; return the job's status."""
        with session_scope(self._session_factory) as session:
            if repository.finish_job(
                session,
                job_id=fit.job_id,
                worker_id=self.worker_id,
                status="failed",
                error=error,
                now=_now(),
            ):
                logger.warning("job %s failed: %s", fit.job_id, error)
                return "failed"
            job = repository.get_job(session, job_id=fit.job_id)
            return job.status if job is not None else "failed"

    def _stop_cancelled(self) -> None:
        with session_scope(self._session_factory) as session:
            cancelled = repository.jobs_with_cancel_requested(session, worker_id=self.worker_id)
        for job_id in cancelled:
            fit = self._running.pop(job_id, None)
            if fit is None:
                continue
            self._end_process(fit)
            with session_scope(self._session_factory) as session:
                repository.finish_job(
                    session,
                    job_id=job_id,
                    worker_id=self.worker_id,
                    status="cancelled",
                    now=_now(),
                )
            logger.info("job %s cancelled", job_id)
            self._observe(fit, "cancelled")

    def _stop_overdue(self) -> None:
        limit = self._settings.job_time_limit_s
        for fit in list(self._running.values()):
            if time.monotonic() - fit.started <= limit:
                continue
            del self._running[fit.job_id]
            self._end_process(fit)
            status = self._fail_if_still_running(fit, f"time limit of {limit:g} s exceeded")
            self._observe(fit, status)

    def _reap_stale(self) -> None:
        now = _now()
        stale_before = now - timedelta(seconds=self._settings.stale_after_s)
        with session_scope(self._session_factory) as session:
            requeued, failed = repository.requeue_stale_jobs(
                session, stale_before=stale_before, now=now
            )
        for job_id in requeued:
            logger.warning("job %s lost its worker; queued again", job_id)
        for job_id in failed:
            logger.warning("job %s lost its worker and has no attempts left; failed", job_id)

    def _claim_and_start(self) -> bool:
        with session_scope(self._session_factory) as session:
            job = repository.claim_next_job(session, worker_id=self.worker_id, now=_now())
            if job is None:
                return False
            job_id, algorithm = job.id, job.algorithm
        alive_reader, alive_writer = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=run_job,
            args=(job_id, self._settings.database_url),
            kwargs={
                "heartbeat_interval_s": self._settings.heartbeat_interval_s,
                "progress_interval_s": self._settings.progress_interval_s,
                "worker_id": self.worker_id,
                "worker_alive": alive_reader,
            },
            name=f"mixreg-fit-{job_id}",
            daemon=True,
        )
        fit = _RunningFit(job_id, algorithm, process, time.monotonic(), alive_writer)
        try:
            process.start()
        except OSError as exc:
            alive_writer.close()
            self._fail_if_still_running(fit, f"could not start the fit process: {exc}")
            return True
        finally:
            alive_reader.close()
        self._running[job_id] = fit
        # Starting may have waited for the fork server; renew the claim's heartbeat so the job
        # does not look stale before its fit process beats for itself.
        with session_scope(self._session_factory) as session:
            repository.heartbeat(session, job_id=job_id, worker_id=self.worker_id, now=_now())
        logger.info("job %s started (%s) by worker %s", job_id, algorithm, self.worker_id)
        return True

    @staticmethod
    def _end_process(fit: _RunningFit) -> None:
        fit.process.terminate()
        fit.process.join(TERMINATE_GRACE_S)
        if fit.process.is_alive():
            fit.process.kill()
            fit.process.join()
        fit.alive_writer.close()

    def _observe(self, fit: _RunningFit, status: str) -> None:
        if self._metrics is not None:
            self._metrics.observe_fit(
                algorithm=fit.algorithm, status=status, seconds=time.monotonic() - fit.started
            )
