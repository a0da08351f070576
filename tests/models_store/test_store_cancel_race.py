"""Cancel is not lost when the job changes state while the cancel is being written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session

from models_store import jobs as job_store
from models_store.session import session_scope

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@contextmanager
def requeue_after_first_job_update(engine: Engine) -> Iterator[list[str]]:
    """Run the reaper on the stale running job right after the first UPDATE of ``jobs`` that the
    block sends: the interleaving of a reaper in another process whose requeue commits between
    two statements of the canceller. Yields the statuses the requeue left the job in."""
    recovered: list[str] = []
    armed = True

    def requeue(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal armed
        if not armed or not statement.lstrip().upper().startswith("UPDATE JOBS"):
            return
        armed = False
        with Session(bind=conn) as reaper:
            requeued, failed = job_store.requeue_stale_jobs(reaper, stale_before=at(60), now=at(61))
            reaper.flush()
        recovered.extend(["queued"] * len(requeued) + ["failed"] * len(failed))

    event.listen(engine, "after_cursor_execute", requeue)
    try:
        yield recovered
    finally:
        event.remove(engine, "after_cursor_execute", requeue)


def test_a_requeue_racing_the_cancel_of_a_running_job_does_not_lose_it(
    db_engine, db_sessionmaker, make_job
):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        assert job_store.claim_next_job(session, worker_id="w", now=at(0)) is not None

    with requeue_after_first_job_update(db_engine), session_scope(db_sessionmaker) as session:
        answered = job_store.request_cancel(session, job_id=job_id, now=at(62))
        assert answered is not None

    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        # The client was told the cancel was accepted: the job must not run again.
        assert (job.status, job.cancel_requested) == ("cancelled", True)
        assert job_store.claim_next_job(session, worker_id="w2", now=at(70)) is None


def test_a_cancel_between_the_reapers_read_and_its_requeue_wins(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        job_store.claim_next_job(session, worker_id="w", now=at(0))
        stale = job_store._stale_running_jobs(session, stale_before=at(60))
        assert [job.job_id for job in stale] == [job_id]
        assert not stale[0].cancel_requested
        job_store.request_cancel(session, job_id=job_id, now=at(61))
        assert job_store._recover_stale(session, stale[0], now=at(62)) == "cancelled"
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.finished_at) == ("cancelled", at(62))
