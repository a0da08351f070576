"""A keyed job's shards and shard claims go when the job ends, however it ends: failed or
cancelled by its worker, cancelled while queued, reaped (failed or cancelled), or released on
shutdown with a cancel pending; they are kept while the job may still use them (requeued after a
lost worker), and retention deletes what an older version left behind."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store import shards as shard_store
from models_store.common import database_now
from models_store.session import session_scope
from models_store.tables import KeyedJobShard, KeyedJobShardClaim
from tests.models_store.conftest import JobFactory

WORKER = "host:1:abc"


def shard_arrays(n_keys: int) -> dict[str, np.ndarray]:
    return {
        "keys": np.arange(n_keys, dtype=np.int64),
        "coef": np.zeros((n_keys, 2, 2)),
        "intercept": np.zeros((n_keys, 2)),
    }


def counts(session: Session, job_id: str) -> tuple[int, int]:
    """(stored shards, shard claims) of ``job_id``."""
    shards = session.scalar(select(func.count()).where(KeyedJobShard.job_id == job_id))
    claims = session.scalar(select(func.count()).where(KeyedJobShardClaim.job_id == job_id))
    return int(shards or 0), int(claims or 0)


def running_job_with_shards(
    factory: sessionmaker[Session], make_job: JobFactory, **job_fields: object
) -> str:
    """A keyed job claimed by :data:`WORKER`, its three shards planned, one stored and one
    claimed."""
    with session_scope(factory) as session:
        job_id = make_job(session, split_by="a", keys_per_shard=2, **job_fields).id
    with session_scope(factory) as session:
        now = database_now(session)
        assert job_store.claim_job(session, job_id=job_id, worker_id=WORKER, now=now)
        plan = [(2, np.array([0, 1])), (2, np.array([2, 3])), (2, np.array([4, 5]))]
        assert shard_store.plan_job_shards(session, job_id=job_id, shards=plan)
    for _ in range(2):
        with session_scope(factory) as session:
            now = database_now(session)
            claim = shard_store.claim_job_shard(
                session, job_id=job_id, claimant=WORKER, now=now, stale_before=now
            )
            assert claim is not None
    with session_scope(factory) as session:
        assert shard_store.store_job_shard(
            session,
            job_id=job_id,
            position=0,
            claimant=WORKER,
            worker_id=WORKER,
            arrays=shard_arrays(2),
        )
    with session_scope(factory) as session:
        assert counts(session, job_id) == (1, 3)
    return job_id


def _fail(session: Session, job_id: str) -> None:
    now = database_now(session)
    assert job_store.finish_job(
        session, job_id=job_id, worker_id=WORKER, status="failed", error="boom", now=now
    )


def _cancel_running(session: Session, job_id: str) -> None:
    job_store.request_cancel(session, job_id=job_id)
    now = database_now(session)
    assert job_store.finish_job(
        session, job_id=job_id, worker_id=WORKER, status="cancelled", now=now
    )


def _reap_without_attempts_left(session: Session, job_id: str) -> None:
    later = database_now(session) + timedelta(hours=1)
    _, failed = job_store.requeue_stale_jobs(session, stale_before=later, now=later)
    assert failed == [job_id]


def _reap_with_a_cancel_pending(session: Session, job_id: str) -> None:
    job_store.request_cancel(session, job_id=job_id)
    later = database_now(session) + timedelta(hours=1)
    assert (
        job_store.recover_stale_job(session, job_id=job_id, stale_before=later, now=later)
        == "cancelled"
    )


def _release_with_a_cancel_pending(session: Session, job_id: str) -> None:
    job_store.request_cancel(session, job_id=job_id)
    now = database_now(session)
    assert job_store.release_job(session, job_id=job_id, worker_id=WORKER, now=now) == ("cancelled")


ENDINGS: dict[str, Callable[[Session, str], None]] = {
    "failed by its worker": _fail,
    "cancelled while running": _cancel_running,
    "reaped, no attempt left": _reap_without_attempts_left,
    "reaped, cancel pending": _reap_with_a_cancel_pending,
    "released, cancel pending": _release_with_a_cancel_pending,
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_keyed_job_that_ends_leaves_no_shards_or_claims(
    db_sessionmaker: sessionmaker[Session], make_job: JobFactory, ending: str
):
    job_id = running_job_with_shards(db_sessionmaker, make_job, max_attempts=1)
    with session_scope(db_sessionmaker) as session:
        ENDINGS[ending](session, job_id)
    with session_scope(db_sessionmaker) as session:
        assert counts(session, job_id) == (0, 0)
        # Work still under way elsewhere stores nothing, and plans nothing, for the ended job.
        assert not shard_store.store_job_shard(
            session,
            job_id=job_id,
            position=1,
            claimant=WORKER,
            worker_id=WORKER,
            arrays=shard_arrays(2),
        )
        assert not shard_store.plan_job_shards(
            session, job_id=job_id, shards=[(2, np.array([0, 1]))]
        )
        assert counts(session, job_id) == (0, 0)


def test_a_requeued_keyed_job_keeps_its_shards_until_cancelled_in_the_queue(
    db_sessionmaker: sessionmaker[Session], make_job: JobFactory
):
    job_id = running_job_with_shards(db_sessionmaker, make_job, max_attempts=3)
    with session_scope(db_sessionmaker) as session:
        later = database_now(session) + timedelta(hours=1)
        requeued, _ = job_store.requeue_stale_jobs(session, stale_before=later, now=later)
        assert requeued == [job_id]
    with session_scope(db_sessionmaker) as session:
        # Its next attempt fits only the shards not stored yet.
        assert counts(session, job_id) == (1, 3)
    with session_scope(db_sessionmaker) as session:
        job = job_store.request_cancel(session, job_id=job_id)
        assert job is not None and job.status == "cancelled"
    with session_scope(db_sessionmaker) as session:
        assert counts(session, job_id) == (0, 0)


def test_retention_deletes_the_shards_older_versions_left_to_finished_jobs(
    db_sessionmaker: sessionmaker[Session], make_job: JobFactory
):
    ended = running_job_with_shards(db_sessionmaker, make_job)
    running = running_job_with_shards(db_sessionmaker, make_job)
    with session_scope(db_sessionmaker) as session:
        _fail(session, ended)
        # As an older version left them: rows of a job already failed.
        session.execute(
            insert(KeyedJobShardClaim).values(
                job_id=ended, position=0, n_keys=2, n_rows=2, rows=b"", keys_done=0, done=False
            )
        )
        session.execute(
            insert(KeyedJobShard).values(
                job_id=ended, position=0, n_keys=2, fitted_attempt=1, data=b""
            )
        )
    with session_scope(db_sessionmaker) as session:
        assert counts(session, ended) == (1, 1)
        assert shard_store.delete_finished_job_shards(session) == 2
    with session_scope(db_sessionmaker) as session:
        assert counts(session, ended) == (0, 0)
        assert counts(session, running) == (1, 3)
