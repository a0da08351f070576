"""The reaper leaves alone the running jobs its caller sees alive, however stale."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from models_store import jobs as job_store
from models_store.session import session_scope

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_jobs_whose_fit_the_caller_sees_running_are_not_requeued(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        mine, lost = make_job(session).id, make_job(session).id
        job_store.claim_next_job(session, worker_id="w", now=T0)
        job_store.claim_next_job(session, worker_id="w", now=T0)
    later = T0 + timedelta(seconds=60)
    with session_scope(db_sessionmaker) as session:
        assert job_store.requeue_stale_jobs(
            session, stale_before=later, now=later, alive=[mine]
        ) == ([lost], [])
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=mine)
        assert job is not None and (job.status, job.attempts) == ("running", 1)
