"""A fit process's hold on its job: the heartbeat loop that keeps a job's (or a shard's) claim
fresh, the progress writes that notice a cancellation, and the exits of a process whose worker
is gone or whose attempt was taken away.

:class:`Lease` is the one heartbeat loop; :class:`Heartbeat` (the job's attempt) and
:class:`service.jobs.shards.ShardStore` (a claimant's shard) each give it the write that renews
their claim.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store.common import database_now
from models_store.session import session_scope
from service.jobs.fitting import finite_or_none

# Exit status of a fit process that stops because the process that started it is gone.
EXIT_PARENT_LOST = 75
# Exit status of a fit process that stops because its attempt at the job is no longer the current
# one (the reaper took the job away; it may run again elsewhere).
EXIT_ATTEMPT_SUPERSEDED = 76

logger = logging.getLogger(__name__)


class FitCancelledError(Exception):
    """Cancellation of the job was requested while it was fitting."""


class JobLostError(Exception):
    """The job is no longer owned by this worker (requeued, failed or cancelled meanwhile)."""


def exit_if_worker_gone(worker_alive: Connection | None, job_id: str) -> None:
    """End the process at once if its worker is gone: ``worker_alive`` is the read end of a
    pipe whose write end only the worker holds, readable (end of file) once the worker died."""
    if worker_alive is not None and worker_alive.poll():
        logger.error("job %s: the worker process is gone; stopping the fit", job_id)
        os._exit(EXIT_PARENT_LOST)


class Lease:
    """A daemon thread that calls ``beat`` every ``interval_s`` until stopped, and ends the
    process before each beat if its worker is gone (:func:`exit_if_worker_gone`).

    ``beat`` renews a claim in the database; a database error is logged and the beat retried
    at the next interval (the log names ``what``). With ``beat_first`` the first beat is at
    once, else after one interval.
    """

    def __init__(
        self,
        beat: Callable[[], None],
        *,
        job_id: str,
        interval_s: float,
        worker_alive: Connection | None,
        what: str,
        beat_first: bool,
    ) -> None:
        self._beat = beat
        self._what = what
        self._job_id = job_id
        self._interval_s = interval_s
        self._worker_alive = worker_alive
        self._beat_first = beat_first
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"mixreg-{what.replace(' ', '-')}", daemon=True
        )

    def start(self) -> None:
        """Start beating."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (idempotent); returns once the thread has ended."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (a beat then in flight may find its claim gone)."""
        return self._stopped.is_set()

    def _run(self) -> None:
        if not self._beat_first and self._stopped.wait(self._interval_s):
            return
        while True:
            exit_if_worker_gone(self._worker_alive, self._job_id)
            try:
                self._beat()
            except SQLAlchemyError:
                logger.exception("job %s: %s failed; retrying", self._job_id, self._what)
            if self._stopped.wait(self._interval_s):
                return


class JobProgress:
    """The progress callback of one job: throttled writes that also check for cancellation."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        attempt: int | None,
        interval_s: float,
    ) -> None:
        self._session_factory = session_factory
        self._job_id = job_id
        self._worker_id = worker_id
        self._attempt = attempt
        self._interval_s = interval_s
        self._last_write: float | None = None

    def __call__(self, fraction: float, info: dict[str, Any]) -> None:
        """Record progress at most every ``interval_s``; raise to abort the fit if needed."""
        now = time.monotonic()
        if self._last_write is not None and now - self._last_write < self._interval_s:
            return
        self._last_write = now
        with session_scope(self._session_factory) as session:
            owned = job_store.update_progress(
                session,
                job_id=self._job_id,
                worker_id=self._worker_id,
                attempt=self._attempt,
                fraction=min(max(float(fraction), 0.0), 1.0),
                iteration=info.get("iteration"),
                candidates=info.get("candidates_tried"),
                best_loss=finite_or_none(info.get("best_loss")),
                n_components=info.get("n_components"),
                keys_done=info.get("keys_done"),
                n_keys=info.get("n_keys"),
                now=database_now(session),
            )
            job = job_store.get_job(session, job_id=self._job_id)
            cancel_requested = job is not None and job.cancel_requested
        if not owned:
            raise JobLostError(self._job_id)
        if cancel_requested:
            raise FitCancelledError(self._job_id)


class Heartbeat:
    """A daemon thread that marks the job alive, from the start of the fit process (before the
    data are loaded), and ends the process if its worker is gone or its attempt superseded.

    ``worker_alive`` is the read end of a pipe whose write end only the worker holds: it
    becomes readable (end of file) when the worker process dies. Without this check a fit
    would outlive a killed server, keep the job's heartbeat fresh and so keep the job from
    being retried. A beat that finds the job no longer running attempt ``attempt`` for this
    worker (the reaper requeued it, another attempt runs it, it was cancelled) ends the
    process at once: its work could never be stored, and it would hold memory and a slot.
    The thread is stopped before the fit's final write, so that write is never mistaken for a
    loss.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        attempt: int | None,
        interval_s: float,
        worker_alive: Connection | None,
    ) -> None:
        self._session_factory = session_factory
        self._job_id = job_id
        self._worker_id = worker_id
        self._attempt = attempt
        self._worker_alive = worker_alive
        self._lease = Lease(
            self._beat,
            job_id=job_id,
            interval_s=interval_s,
            worker_alive=worker_alive,
            what="heartbeat",
            beat_first=True,
        )

    def __enter__(self) -> Heartbeat:
        self._lease.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop beating (idempotent); returns once the thread has ended."""
        self._lease.stop()

    def exit_if_worker_gone(self) -> None:
        """End the process at once if its worker is gone (checked before the final write too:
        the beat runs once a second, and a fit its worker no longer runs must not finish the
        job on an attempt the reaper is about to retry)."""
        exit_if_worker_gone(self._worker_alive, self._job_id)

    def _beat(self) -> None:
        with session_scope(self._session_factory) as session:
            owned = job_store.heartbeat(
                session,
                job_id=self._job_id,
                worker_id=self._worker_id,
                attempt=self._attempt,
                now=database_now(session),
            )
        if not owned and not self._lease.stopped:
            logger.warning(
                "job %s: attempt %s is no longer current; stopping the fit process",
                self._job_id,
                self._attempt,
            )
            os._exit(EXIT_ATTEMPT_SUPERSEDED)
