"""Recovering one job of a lost worker, handing one back, and the jobs a task queue lacks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from models_store import jobs as job_store
from models_store.session import session_scope

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_recover_stale_job_requeues_fails_or_leaves_one_job(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        fresh = make_job(session).id
        stale = make_job(session).id
        last_attempt = make_job(session, max_attempts=1).id
        queued = make_job(session).id
        for job_id in (fresh, stale, last_attempt):
            assert job_store.claim_job(session, job_id=job_id, worker_id="w1", now=at(0))
        job_store.heartbeat(session, job_id=fresh, worker_id="w1", now=at(50))

    with session_scope(db_sessionmaker) as session:
        recover = {
            job_id: job_store.recover_stale_job(
                session, job_id=job_id, stale_before=at(30), now=at(60)
            )
            for job_id in (fresh, stale, last_attempt, queued, "not-an-id")
        }
    assert recover == {
        fresh: None,
        stale: "queued",
        last_attempt: "failed",
        queued: None,
        "not-an-id": None,
    }
    with session_scope(db_sessionmaker) as session:
        assert job_store.get_job(session, job_id=fresh).status == "running"
        requeued = job_store.get_job(session, job_id=stale)
        assert (requeued.status, requeued.worker_id, requeued.attempts) == ("queued", None, 1)
        failed = job_store.get_job(session, job_id=last_attempt)
        assert failed.status == "failed"
        assert failed.error == (
            f"worker lost: no heartbeat since {at(0).isoformat()}; gave up after 1 attempts"
        )


def test_release_job_hands_back_one_job_of_its_worker(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        mine = make_job(session).id
        cancelled = make_job(session).id
        others = make_job(session).id
        for job_id, worker in ((mine, "w1"), (cancelled, "w1"), (others, "w2")):
            assert job_store.claim_job(session, job_id=job_id, worker_id=worker, now=at(0))
        job_store.request_cancel(session, job_id=cancelled, now=at(1))

    with session_scope(db_sessionmaker) as session:
        assert job_store.release_job(session, job_id=mine, worker_id="w1", now=at(2)) == "queued"
        assert (
            job_store.release_job(session, job_id=cancelled, worker_id="w1", now=at(2))
            == "cancelled"
        )
        assert job_store.release_job(session, job_id=others, worker_id="w1", now=at(2)) is None
    with session_scope(db_sessionmaker) as session:
        released = job_store.get_job(session, job_id=mine)
        assert (released.status, released.attempts, released.worker_id) == ("queued", 0, None)
        assert job_store.get_job(session, job_id=others).status == "running"


def test_queued_jobs_without_task_are_those_no_task_carries(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        untasked = make_job(session).id
        tasked = make_job(session).id
        job_store.set_task_id(session, job_id=tasked, task_id=41)
        running = make_job(session).id
        job_store.claim_job(session, job_id=running, worker_id="w1", now=at(0))

    with session_scope(db_sessionmaker) as session:
        assert job_store.queued_jobs_without_task(session) == [untasked]
        assert job_store.get_job(session, job_id=tasked).task_id == 41
