"""The fit processes of one worker: start a claimed job's fit in a child process and watch it.

Both workers use this: the embedded worker (a thread in an API process that polls the
``jobs`` table) and the Procrastinate worker (``mixreg worker``). Whichever claimed the job, the
child runs :func:`service.jobs.training.run_job`, and the supervisor stops a fit whose
cancellation was requested, kills one that exceeds the load or the job time limit, fails the
job of a fit process that died, and hands running jobs back on a clean shutdown. Every write is
conditional on the job still being the worker's own (see ``models_store.jobs``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store.common import database_now
from models_store.session import session_scope
from service.config import Settings
from service.jobs.lease import EXIT_ATTEMPT_SUPERSEDED, EXIT_PARENT_LOST
from service.jobs.training import run_job, run_shards
from service.metrics import ServiceMetrics

logger = logging.getLogger(__name__)

# How long a stopped child gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 1.0


def new_worker_id() -> str:
    """A worker id that names the machine and the process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def describe_exit(exitcode: int | None) -> str:
    """Why a fit process ended before it finished its job, for the job's error."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the fit process was killed by {name} before it finished the job"
    if exitcode == EXIT_PARENT_LOST:
        return "the fit process lost its worker before it finished the job"
    if exitcode == EXIT_ATTEMPT_SUPERSEDED:
        return "the fit process stopped: its attempt at the job is no longer the current one"
    return f"the fit process exited with code {exitcode} before it finished the job"


def fit_process_context() -> multiprocessing.context.ForkServerContext:
    """The multiprocessing context fit processes start from.

    The fork server imports the fit code once; each fit then starts in milliseconds instead of
    re-importing scikit-learn, and no process is forked from a threaded one. A child also
    re-runs the imports of the server's main script: ``python -m uvicorn`` has none that it
    re-runs, the ``mixreg`` console script imports only ``mixreg_client.cli``, which is light,
    so a fit process holds neither the web server nor the scale-out queue nor the terminal UI.
    """
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, multiprocessing.context.ForkServerContext)
    context.set_forkserver_preload(["service.jobs.training", "mixreg_client.cli"])
    return context


def run_niced(niceness: int, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``target(*args, **kwargs)`` in a process ``niceness`` steps nicer than its worker.

    Fits and a keyed job's shards are batch work: when they keep every core busy, the
    scheduler still gives the server (and the worker's own heartbeats) the CPU first, so
    requests keep their latency."""
    if niceness:
        os.nice(niceness)
    return target(*args, **kwargs)


@dataclass
class RunningFit:
    """A job's fit running in a child process."""

    job_id: str
    algorithm: str
    attempt: int
    """The job's attempt this process runs (its ``attempts`` when claimed)."""
    process: BaseProcess
    started: float
    # Held open while the fit runs; the child sees end of file if this process dies.
    alive_writer: Connection
    # Set by the child once the job's data are loaded: the job time limit counts from then.
    data_loaded: EventType
    fit_started: float | None = None

    def loading_for(self) -> float:
        """Seconds since the fit process was started, while it loads the data (0 after)."""
        if self.data_loaded.is_set():
            return 0.0
        return time.monotonic() - self.started

    def fitting_for(self) -> float:
        """Seconds since the fit process finished loading the data (0 while it loads)."""
        if self.fit_started is None:
            if not self.data_loaded.is_set():
                return 0.0
            self.fit_started = time.monotonic()
        return time.monotonic() - self.fit_started

    @property
    def pid(self) -> int | None:
        """The fit process's id."""
        return self.process.pid


class FitSupervisor:
    """Starts the fits of jobs claimed by ``worker_id`` and enforces their end."""

    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        settings: Settings,
        worker_id: str,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.worker_id = worker_id
        self._session_factory = session_factory
        self._settings = settings
        self._metrics = metrics
        self._context = fit_process_context()

    def warm_up(self) -> None:
        """Start the fork server and wait until it has imported the fit code (seconds), so
        that the first fit does not wait for it."""
        process = self._context.Process(target=os.getpid, name="mixreg-fork-server-warm-up")
        process.start()
        process.join()

    def start(self, job_id: str, algorithm: str, attempt: int) -> RunningFit | None:
        """Start attempt ``attempt`` at ``job_id``, just claimed by this worker, in a child
        process.

        Returns None if the process could not be started (the job is then failed).
        """
        alive_reader, alive_writer = self._context.Pipe(duplex=False)
        data_loaded = self._context.Event()
        process = self._context.Process(
            target=run_niced,
            args=(self._settings.fit_niceness, run_job, job_id, self._settings.database_url),
            kwargs={
                "heartbeat_interval_s": self._settings.heartbeat_interval_s,
                "progress_interval_s": self._settings.progress_interval_s,
                "worker_id": self.worker_id,
                "attempt": attempt,
                "worker_alive": alive_reader,
                "data_loaded": data_loaded,
                "log_format": self._settings.log_format,
                "stale_after_s": self._settings.stale_after_s,
                "keyed_global_rows": self._settings.keyed_global_rows,
                "max_key_chars": self._settings.max_key_chars,
                "max_keyed_coefficients": self._settings.max_keyed_coefficients,
            },
            name=f"mixreg-fit-{job_id}",
            daemon=True,
        )
        fit = RunningFit(
            job_id, algorithm, attempt, process, time.monotonic(), alive_writer, data_loaded
        )
        try:
            process.start()
        except OSError as exc:
            alive_writer.close()
            self._fail_if_still_running(fit, f"could not start the fit process: {exc}")
            return None
        finally:
            alive_reader.close()
        # Starting may have waited for the fork server; renew the claim's heartbeat so the job
        # does not look stale before its fit process beats for itself.
        with session_scope(self._session_factory) as session:
            job_store.heartbeat(
                session,
                job_id=job_id,
                worker_id=self.worker_id,
                attempt=attempt,
                now=database_now(session),
            )
        logger.info(
            "job %s started (%s) by worker %s in process %s",
            job_id,
            algorithm,
            self.worker_id,
            process.pid,
        )
        return fit

    def start_shards(self, job_id: str) -> tuple[BaseProcess, Connection]:
        """Start a child process that fits free shards of the keyed job ``job_id`` beside the
        process running the job (:func:`service.jobs.training.run_shards`); return it and the
        write end of the pipe whose closing (this process dying) stops it."""
        alive_reader, alive_writer = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=run_niced,
            args=(self._settings.fit_niceness, run_shards, job_id, self._settings.database_url),
            kwargs={
                "worker_id": self.worker_id,
                "heartbeat_interval_s": self._settings.heartbeat_interval_s,
                "stale_after_s": self._settings.stale_after_s,
                "worker_alive": alive_reader,
                "log_format": self._settings.log_format,
            },
            name=f"mixreg-shards-{job_id}",
            daemon=True,
        )
        try:
            process.start()
        finally:
            alive_reader.close()
        logger.info(
            "job %s: fitting its shards in process %s of worker %s",
            job_id,
            process.pid,
            self.worker_id,
        )
        return process, alive_writer

    def check(self, fit: RunningFit, *, cancel_requested: bool) -> str | None:
        """One look at a running fit; return the job's final status once the fit is over.

        A fit process that exited is collected (its job failed if it did not finish it); a fit
        whose cancellation was requested is stopped and its job cancelled; one that has loaded
        its data for longer than the load time limit, or fitted for longer than the job time
        limit (loading the data does not count), is killed and its job failed. None while the
        fit goes on.
        """
        if not fit.process.is_alive():
            fit.process.join()
            fit.alive_writer.close()
            return self._observe(
                fit, self._fail_if_still_running(fit, describe_exit(fit.process.exitcode))
            )
        if cancel_requested:
            self.end_process(fit)
            with session_scope(self._session_factory) as session:
                cancelled = job_store.finish_job(
                    session,
                    job_id=fit.job_id,
                    worker_id=self.worker_id,
                    attempt=fit.attempt,
                    status="cancelled",
                    now=database_now(session),
                )
            if cancelled:
                logger.info("job %s cancelled", fit.job_id)
                return self._observe(fit, "cancelled")
            # The fit finished (or lost) the job just before it was stopped.
            return self._observe(fit, self._status_of(fit.job_id))
        load_limit = self._settings.load_time_limit_s
        if fit.loading_for() > load_limit:
            self.end_process(fit)
            return self._observe(
                fit,
                self._fail_if_still_running(
                    fit,
                    f"loading the dataset took longer than the load time limit of "
                    f"{load_limit:g} s (MIXREG_LOAD_TIME_LIMIT_S); raise the limit or fit a "
                    f"smaller dataset",
                ),
            )
        limit = self._settings.job_time_limit_s
        if fit.fitting_for() > limit:
            self.end_process(fit)
            return self._observe(
                fit, self._fail_if_still_running(fit, f"time limit of {limit:g} s exceeded")
            )
        return None

    def hand_back(self, fit: RunningFit) -> str | None:
        """Stop ``fit`` for a clean shutdown and put its job straight back in the queue.

        The interrupted attempt is not counted. Returns the job's new status (``queued``, or
        ``cancelled`` if its cancellation was requested), or None if the job was no longer
        this worker's.
        """
        self.end_process(fit)
        with session_scope(self._session_factory) as session:
            status = job_store.release_job(
                session,
                job_id=fit.job_id,
                worker_id=self.worker_id,
                now=database_now(session),
            )
        if status == "queued":
            logger.info("job %s queued again on shutdown", fit.job_id)
        return status

    @staticmethod
    def end_process(fit: RunningFit) -> None:
        """Terminate the fit process (kill it if it does not exit within the grace)."""
        fit.process.terminate()
        fit.process.join(TERMINATE_GRACE_S)
        if fit.process.is_alive():
            fit.process.kill()
            fit.process.join()
        fit.alive_writer.close()

    def _fail_if_still_running(self, fit: RunningFit, error: str) -> str:
        """Fail the job of a fit that ended without finishing it; return the job's status."""
        with session_scope(self._session_factory) as session:
            if job_store.finish_job(
                session,
                job_id=fit.job_id,
                worker_id=self.worker_id,
                attempt=fit.attempt,
                status="failed",
                error=error,
                now=database_now(session),
            ):
                logger.warning("job %s failed: %s", fit.job_id, error)
                return "failed"
        return self._status_of(fit.job_id)

    def _status_of(self, job_id: str) -> str:
        with session_scope(self._session_factory) as session:
            job = job_store.get_job(session, job_id=job_id)
            return job.status if job is not None else "failed"

    def _observe(self, fit: RunningFit, status: str) -> str:
        if self._metrics is not None:
            self._metrics.observe_fit(
                algorithm=fit.algorithm, status=status, seconds=time.monotonic() - fit.started
            )
        return status
