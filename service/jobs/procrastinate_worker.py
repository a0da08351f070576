"""``mixreg worker``: a Procrastinate worker that runs fit jobs, on any number of machines.

Every fit job is carried by one Procrastinate task, ``mixreg.fit(job_id)``, deferred in the
transaction that inserted the job (:mod:`service.jobs.task_queue`). The ``jobs`` table stays
the truth for the job's state; Procrastinate's tables are only the queue
(``docs/adr/0008-procrastinate-and-the-jobs-table.md``). A worker:

- runs a task by claiming its job in the ``jobs`` table, the same conditional update as the
  embedded worker's; a task whose job is finished, cancelled or running elsewhere does nothing.
  The fit runs in a child process through the embedded worker's
  :class:`~service.jobs.supervisor.FitSupervisor`, which calls the one fit path
  (:func:`service.jobs.training.run_job`): heartbeats, progress, the job time limit, a fit
  process that dies;
- stops a fit when Procrastinate asks to abort its task, which a cancellation requests;
- on a clean shutdown (SIGTERM, SIGINT) hands its running jobs back at once without spending
  an attempt, and Procrastinate retries their tasks for another worker;
- recovers the tasks of workers that died: a task still "doing" on a worker whose Procrastinate
  heartbeat is older than ``MIXREG_STALE_AFTER_S``, and whose fit's heartbeat is as old, gets
  the embedded reaper's decision on its job (queued again, or failed "worker lost" once out of
  attempts) and is retried or finished to match. One worker at a time does this, under a
  PostgreSQL advisory lock;
- spreads a keyed job over the workers: once the job's fit has planned its shards, the worker
  running it defers ``mixreg.fit_shards`` tasks; each, on whichever worker has a free slot,
  fits free shards in a child process (reading only their rows) until none is free, beside the
  job's own fit, which fits shards too, waits for the others and stores the model
  (``docs/adr/0027-keyed-shards-over-several-workers.md``);
- defers a task for every queued job that has none (queued by a process in embedded mode), so
  switching a deployment to Procrastinate strands no job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import procrastinate
import psycopg
from procrastinate.exceptions import JobAborted
from procrastinate.job_context import AbortReason
from procrastinate.jobs import Job as Task
from procrastinate.jobs import Status as TaskStatus
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store import shards as shard_store
from models_store.common import database_now, utcnow
from models_store.session import make_engine, make_sessionmaker, session_scope
from service.config import Settings
from service.jobs.retention import apply_retention
from service.jobs.supervisor import FitSupervisor, RunningFit, new_worker_id
from service.jobs.task_queue import (
    FIT_QUEUE,
    FIT_TASK,
    SHARDS_TASK,
    FitTaskQueue,
    libpq_conninfo,
)
from service.logs import job_context

logger = logging.getLogger(__name__)

MAX_SHARD_TASKS = 16
"""Shard tasks deferred per keyed job at most: each fits shards until none is free, so more
tasks than free worker slots only end at once."""

RECOVERY_LOCK_KEY = 0x6D69787265670002
"""PostgreSQL advisory lock held by the one worker that recovers stalled tasks at a time."""

# The task's end state in Procrastinate for each final state of its job.
TASK_STATUS = {
    "succeeded": TaskStatus.SUCCEEDED,
    "failed": TaskStatus.FAILED,
    "cancelled": TaskStatus.ABORTED,
}


class JobHandedBackError(Exception):
    """The worker is shutting down and put the job back in the queue; its task is retried."""


class JobFailedError(Exception):
    """The job failed (its error is on the job); the task fails too, without a retry."""


class RetryHandedBack(procrastinate.BaseRetryStrategy):
    """Retry a task at once when its worker handed its job back, and never otherwise: a failed
    fit is final, and a worker lost mid-fit is recovered with the job's own attempts."""

    def get_retry_decision(
        self, *, exception: BaseException, job: Task
    ) -> procrastinate.RetryDecision | None:
        """A retry now for :class:`JobHandedBackError`, else None."""
        if isinstance(exception, JobHandedBackError):
            return procrastinate.RetryDecision(retry_in={"seconds": 0})
        return None


class _AdvisoryLock:
    """A PostgreSQL session-level advisory lock on a dedicated connection of its own.

    The lock goes with the connection, so a worker that dies releases it.
    """

    def __init__(self, conninfo: str, key: int) -> None:
        self._conninfo = conninfo
        self._key = key
        self._connection: psycopg.AsyncConnection[Any] | None = None

    async def try_acquire(self) -> bool:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True
            )
        cursor = await self._connection.execute("SELECT pg_try_advisory_lock(%s)", (self._key,))
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def release(self) -> None:
        if self._connection is not None and not self._connection.closed:
            await self._connection.execute("SELECT pg_advisory_unlock(%s)", (self._key,))

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


@dataclass(frozen=True)
class TaskClaim:
    """What a fit task found: whether it claimed its job, the job's status (``"missing"`` if
    there is no such job) and its algorithm."""

    claimed: bool
    found: str
    algorithm: str
    attempt: int
    keyed: bool = False


def claim_for_task(
    session_factory: sessionmaker[Session], *, job_id: str, worker_id: str
) -> TaskClaim:
    """Claim ``job_id`` for ``worker_id`` if it is still queued, in one unit of work.

    A task retried after its job finished, was cancelled or went to another worker claims
    nothing and changes no row: the ``jobs`` table, not the queue, says what is left to do.
    """
    with session_scope(session_factory) as session:
        claimed = job_store.claim_job(
            session, job_id=job_id, worker_id=worker_id, now=database_now(session)
        )
        job = job_store.get_job(session, job_id=job_id)
        return TaskClaim(
            claimed=claimed,
            found="missing" if job is None else job.status,
            algorithm="" if job is None else job.algorithm,
            attempt=0 if job is None else job.attempts,
            keyed=job is not None and job.split_by is not None,
        )


class FitWorker:
    """One ``mixreg worker`` process: up to ``concurrency`` fits at once."""

    def __init__(self, settings: Settings, *, concurrency: int) -> None:
        self.worker_id = new_worker_id()
        self._settings = settings
        self._concurrency = concurrency
        self._conninfo = libpq_conninfo(settings.database_url)
        self._task_queue = FitTaskQueue()
        # Built in run(): nothing heavy at construction.
        self._session_factory: sessionmaker[Session] | None = None
        self._supervisor: FitSupervisor | None = None
        self._next_retention = 0.0

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then hand the running jobs back and return."""
        asyncio.run(self._main())

    async def _main(self) -> None:
        engine = make_engine(self._settings.database_url)
        self._session_factory = make_sessionmaker(engine)
        self._supervisor = FitSupervisor(
            session_factory=self._session_factory,
            settings=self._settings,
            worker_id=self.worker_id,
        )
        # Procrastinate runs each synchronous task in a thread of the default executor; give
        # every slot a thread, beside the few the recovery and the heartbeats use.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=self._concurrency + 4, thread_name_prefix="mixreg")
        )
        try:
            await asyncio.to_thread(self._supervisor.warm_up)
            app = self._procrastinate_app()
            async with app.open_async():
                recovery = asyncio.create_task(self._recover_forever(app), name="recovery")
                logger.info(
                    "worker %s running up to %d fits at once", self.worker_id, self._concurrency
                )
                try:
                    await app.run_worker_async(
                        queues=[FIT_QUEUE],
                        name="mixreg-worker",
                        concurrency=self._concurrency,
                        # New tasks and abort requests arrive by LISTEN/NOTIFY; polling is
                        # the fallback (and how retried tasks are found).
                        fetch_job_polling_interval=max(self._settings.poll_interval_s, 1.0),
                        abort_job_polling_interval=max(self._settings.poll_interval_s, 1.0),
                        # A shutdown hands the running jobs back at once instead of waiting.
                        shutdown_graceful_timeout=0,
                        update_heartbeat_interval=self._settings.heartbeat_interval_s,
                        stalled_worker_timeout=self._settings.stale_after_s,
                    )
                finally:
                    recovery.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await recovery
        finally:
            engine.dispose()

    def _procrastinate_app(self) -> procrastinate.App:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self._conninfo))
        app.task(name=FIT_TASK, queue=FIT_QUEUE, pass_context=True, retry=RetryHandedBack())(
            self.run_task
        )
        app.task(name=SHARDS_TASK, queue=FIT_QUEUE, pass_context=True)(self.run_shard_task)
        return app

    # Running a task ---------------------------------------------------------------------------

    def run_task(self, context: procrastinate.JobContext, job_id: str) -> str:
        """The task ``mixreg.fit``: claim ``job_id``, fit it in a child process, watch it.

        Runs in a thread of the worker. Returns the job's final status, or what was found
        instead of a queued job; raises ``JobAborted`` for a cancelled job, ``JobFailedError`` for
        a failed one and ``JobHandedBackError`` when the worker is shutting down.
        """
        with job_context(job_id):
            return self._claim_and_watch(context, job_id)

    def _claim_and_watch(self, context: procrastinate.JobContext, job_id: str) -> str:
        assert self._session_factory is not None and self._supervisor is not None
        claim = claim_for_task(self._session_factory, job_id=job_id, worker_id=self.worker_id)
        if not claim.claimed:
            logger.info("job %s is %s, not queued; its task has nothing to do", job_id, claim.found)
            return f"nothing to do: the job is {claim.found}"
        fit = self._supervisor.start(job_id, claim.algorithm, claim.attempt)
        status = (
            self._status_of(job_id)
            if fit is None
            else self._watch(fit, context.abort_reason, keyed=claim.keyed)
        )
        if status == "cancelled":
            raise JobAborted(f"job {job_id} cancelled")
        if status == "failed":
            raise JobFailedError(f"job {job_id} failed: {self._error_of(job_id)}")
        return status

    def _watch(
        self,
        fit: RunningFit,
        abort_reason: Callable[[], AbortReason | None],
        *,
        keyed: bool = False,
    ) -> str:
        assert self._supervisor is not None
        # A keyed job's shard tasks are deferred once its fit has planned the shards.
        shards_deferred = not keyed
        while True:
            if not shards_deferred:
                shards_deferred = self._defer_shard_tasks(fit.job_id)
            reason = abort_reason()
            if reason is AbortReason.SHUTDOWN:
                if self._supervisor.hand_back(fit) == "queued":
                    raise JobHandedBackError(f"job {fit.job_id} queued again on shutdown")
                return self._status_of(fit.job_id)
            status = self._supervisor.check(fit, cancel_requested=reason is not None)
            if status is not None:
                return status
            time.sleep(self._settings.poll_interval_s)

    def _defer_shard_tasks(self, job_id: str) -> bool:
        """Defer a shard task per free shard but one (the job's own fit takes one), at most
        :data:`MAX_SHARD_TASKS`, once the keyed job ``job_id`` has planned its shards; False
        while it has not."""
        assert self._session_factory is not None
        with session_scope(self._session_factory) as session:
            counts = shard_store.job_shard_counts(session, job_id=job_id)
            if counts.n_shards == 0:
                return False
            count = min(counts.claimable - 1, MAX_SHARD_TASKS)
            if count > 0:
                self._task_queue.enqueue_shards(session, job_id, count)
        logger.info("job %s: %d shard tasks deferred", job_id, max(count, 0))
        return True

    def run_shard_task(self, context: procrastinate.JobContext, job_id: str) -> str:
        """The task ``mixreg.fit_shards``: fit free shards of the keyed job ``job_id`` in a
        child process until none is free (:func:`service.jobs.training.run_shards`).

        Runs in a thread of the worker. On a shutdown the child is stopped: the shard it held
        goes stale and is fitted by another claimant. A cancelled job stops the child by
        itself (its shard heartbeat sees it).
        """
        assert self._session_factory is not None and self._supervisor is not None
        with job_context(job_id):
            with session_scope(self._session_factory) as session:
                free = shard_store.job_shard_counts(session, job_id=job_id).claimable
            if not free:
                return "nothing to do: no free shard"
            process, alive_writer = self._supervisor.start_shards(job_id)
            try:
                while process.is_alive():
                    if context.abort_reason() is not None:
                        process.terminate()
                        process.join()
                        return "stopped"
                    time.sleep(self._settings.poll_interval_s)
                process.join()
            finally:
                alive_writer.close()
            return f"shards fitted; the process exited with {process.exitcode}"

    def _status_of(self, job_id: str) -> str:
        assert self._session_factory is not None
        with session_scope(self._session_factory) as session:
            job = job_store.get_job(session, job_id=job_id)
            return "failed" if job is None else job.status

    def _error_of(self, job_id: str) -> str | None:
        assert self._session_factory is not None
        with session_scope(self._session_factory) as session:
            job = job_store.get_job(session, job_id=job_id)
            return None if job is None else job.error

    # Recovering the tasks of lost workers -----------------------------------------------------

    async def _recover_forever(self, app: procrastinate.App) -> None:
        lock = _AdvisoryLock(self._conninfo, RECOVERY_LOCK_KEY)
        try:
            while True:
                try:
                    if await lock.try_acquire():
                        try:
                            await self.recover_once(app)
                        finally:
                            await lock.release()
                except Exception:
                    # A database hiccup must not end the worker; the next round retries.
                    logger.exception("recovering stalled tasks failed; retrying")
                    await lock.close()
                await asyncio.sleep(self._settings.heartbeat_interval_s)
        finally:
            await lock.close()

    async def recover_once(self, app: procrastinate.App) -> None:
        """Recover the stalled fit tasks and give a task to every queued job without one."""
        stalled = await app.job_manager.get_stalled_jobs(
            queue=FIT_QUEUE,
            task_name=FIT_TASK,
            seconds_since_heartbeat=self._settings.stale_after_s,
        )
        for task in stalled:
            job_id = str(task.task_kwargs.get("job_id", ""))
            status = await asyncio.to_thread(self._recover_job, job_id)
            if status is None:
                continue  # its fit still beats; it ends by itself or goes stale later
            if status == "queued":
                await app.job_manager.retry_job(task)
                logger.warning("task %s of job %s lost its worker; retried", task.id, job_id)
            else:
                await app.job_manager.finish_job(task, status=TASK_STATUS[status], delete_job=False)
                logger.info(
                    "task %s of job %s lost its worker; the job is %s", task.id, job_id, status
                )
        # A shard task of a lost worker only ends: its shard's claim goes stale by itself.
        for task in await app.job_manager.get_stalled_jobs(
            queue=FIT_QUEUE,
            task_name=SHARDS_TASK,
            seconds_since_heartbeat=self._settings.stale_after_s,
        ):
            await app.job_manager.finish_job(task, status=TaskStatus.FAILED, delete_job=False)
        await asyncio.to_thread(self._defer_missing_tasks)
        if time.monotonic() >= self._next_retention:
            assert self._session_factory is not None  # built in _main
            await asyncio.to_thread(
                apply_retention, self._session_factory, self._settings, now=utcnow()
            )
            self._next_retention = time.monotonic() + self._settings.retention_interval_s

    def _recover_job(self, job_id: str) -> str | None:
        """Apply the reaper's decision to the job of a stalled task; return the job's status,
        or None while it is running with a fresh heartbeat."""
        assert self._session_factory is not None
        with session_scope(self._session_factory) as session:
            now = database_now(session)
            stale_before = now - timedelta(seconds=self._settings.stale_after_s)
            recovered = job_store.recover_stale_job(
                session, job_id=job_id, stale_before=stale_before, now=now
            )
            job = job_store.get_job(session, job_id=job_id)
            status = "failed" if job is None else job.status
        if recovered == "queued":
            logger.warning("job %s lost its worker; queued again", job_id)
        elif recovered == "failed":
            logger.warning("job %s lost its worker and has no attempts left; failed", job_id)
        return None if status == "running" else status

    def _defer_missing_tasks(self) -> None:
        assert self._session_factory is not None
        with session_scope(self._session_factory) as session:
            for job_id in job_store.queued_jobs_without_task(session):
                task_id = self._task_queue.enqueue(session, job_id)
                logger.info("job %s was queued without a task; deferred task %s", job_id, task_id)
