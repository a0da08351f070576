"""Jobs: the lifecycle and its conditional updates, cancellation and stale-job recovery."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import read_scope, session_scope
from models_store.tables import Job

T0 = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_create_job_stores_the_request_and_starts_queued(db_sessionmaker, dataset_id, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(
            session,
            name="first",
            params={"step_size": 0.1, "init": [[0.1, -0.0]]},
            time_budget_s=2.5,
            idempotency_key="key-1",
            request_hash="abc",
        ).id

    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.attempts, job.cancel_requested) == ("queued", 0, False)
        assert (job.dataset_id, job.name, job.algorithm, job.n_components) == (
            dataset_id,
            "first",
            "am",
            2,
        )
        assert job.params == {"step_size": 0.1, "init": [[0.1, -0.0]]}
        assert (job.fit_intercept, job.holdout_fraction, job.seed) == (True, 0.2, 7)
        assert (job.time_budget_s, job.max_attempts, job.progress_fraction) == (2.5, 3, 0.0)
        assert (job.worker_id, job.started_at, job.finished_at, job.model_id) == (
            None,
            None,
            None,
            None,
        )
        assert job.created_at.tzinfo is not None and job.created_at.utcoffset() == timedelta(0)
        assert job_store.get_job_by_idempotency_key(session, api_key_id=None, key="key-1") == job
        assert job_store.get_job_by_idempotency_key(session, api_key_id=None, key="key-2") is None
        assert job_store.get_job(session, job_id="f" * 32) is None


def test_idempotency_key_is_unique(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        make_job(session, idempotency_key="same")
    with pytest.raises(IntegrityError), session_scope(db_sessionmaker) as session:
        make_job(session, idempotency_key="same")


def test_idempotency_keys_are_unique_per_api_key(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        keyless = make_job(session, idempotency_key="same").id
        of_a = make_job(session, idempotency_key="same", api_key_id="a" * 12).id
        of_b = make_job(session, idempotency_key="same", api_key_id="b" * 12).id
    assert len({keyless, of_a, of_b}) == 3
    with session_scope(db_sessionmaker) as session:
        found = [
            job_store.get_job_by_idempotency_key(session, api_key_id=owner, key="same")
            for owner in (None, "a" * 12, "b" * 12, "c" * 12)
        ]
        assert [job.id if job else None for job in found] == [keyless, of_a, of_b, None]
    with pytest.raises(IntegrityError), session_scope(db_sessionmaker) as session:
        make_job(session, idempotency_key="same", api_key_id="a" * 12)


def test_a_job_keeps_the_id_of_its_deleted_dataset(db_sessionmaker, make_job, dataset_id):
    # Datasets can be deleted (migration 0007 dropped the foreign key); a job keeps the id as
    # provenance.
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
    with session_scope(db_sessionmaker) as session:
        assert dataset_store.delete_dataset(session, dataset_id=dataset_id)
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None and job.dataset_id == dataset_id
        assert dataset_store.get_dataset(session, dataset_id=dataset_id) is None


def test_lifecycle_claim_progress_heartbeat_finish(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id

    with session_scope(db_sessionmaker) as session:
        job = job_store.claim_next_job(session, worker_id="w1", now=at(0))
        assert job is not None and job.id == job_id
        assert (job.status, job.worker_id, job.attempts) == ("running", "w1", 1)
        assert job.started_at == at(0) and job.heartbeat_at == at(0)
        assert job_store.claim_next_job(session, worker_id="w2", now=at(0)) is None

    with session_scope(db_sessionmaker) as session:
        assert job_store.update_progress(
            session,
            job_id=job_id,
            worker_id="w1",
            fraction=0.5,
            iteration=10,
            candidates=400,
            best_loss=0.25,
            now=at(1),
        )
        assert job_store.heartbeat(session, job_id=job_id, worker_id="w1", now=at(2))

    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.progress_fraction, job.progress_iteration, job.progress_candidates) == (
            0.5,
            10,
            400,
        )
        assert (job.progress_best_loss, job.heartbeat_at) == (0.25, at(2))
        assert job_store.finish_job(
            session,
            job_id=job_id,
            worker_id="w1",
            status="succeeded",
            model_id="m" * 32,
            now=at(3),
        )

    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.model_id, job.error) == ("succeeded", "m" * 32, None)
        assert (job.finished_at, job.progress_fraction) == (at(3), 1.0)


def test_conditional_updates_refuse_when_not_owned_or_not_running(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        owned = {"job_id": job_id, "worker_id": "w1"}
        stranger = {"job_id": job_id, "worker_id": "w2"}
        progress = {"fraction": 0.1, "iteration": 1, "candidates": None, "best_loss": 1.0}

        # Not claimed yet: nobody owns it.
        assert not job_store.heartbeat(session, **owned, now=at(0))
        assert not job_store.update_progress(session, **owned, **progress, now=at(0))
        assert not job_store.finish_job(session, **owned, status="failed", now=at(0))

        assert job_store.claim_next_job(session, worker_id="w1", now=at(0)) is not None
        assert not job_store.heartbeat(session, **stranger, now=at(1))
        assert not job_store.update_progress(session, **stranger, **progress, now=at(1))
        assert not job_store.finish_job(session, **stranger, status="failed", now=at(1))
        with pytest.raises(ValueError, match="status must be one of"):
            job_store.finish_job(session, **owned, status="queued", now=at(1))

        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.worker_id, job.heartbeat_at) == ("running", "w1", at(0))
        assert job.progress_fraction == 0.0

        assert job_store.finish_job(session, **owned, status="failed", error="boom", now=at(2))
        # Finished: the owner can neither beat, report progress nor finish again.
        assert not job_store.heartbeat(session, **owned, now=at(3))
        assert not job_store.update_progress(session, **owned, **progress, now=at(3))
        assert not job_store.finish_job(session, **owned, status="succeeded", now=at(3))
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.error, job.finished_at) == ("failed", "boom", at(2))


def test_claim_takes_the_oldest_queued_job_first(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        created = [make_job(session).id for _ in range(3)]
    with session_scope(db_sessionmaker) as session:
        claimed = [job_store.claim_next_job(session, worker_id="w", now=at(0)) for _ in range(4)]
    assert [job.id if job else None for job in claimed] == [*created, None]


def test_any_queued_job_sees_queued_jobs_only(db_sessionmaker, make_job):
    with read_scope(db_sessionmaker) as session:
        assert job_store.any_queued_job(session) is False
    with session_scope(db_sessionmaker) as session:
        created = [make_job(session).id for _ in range(2)]
    with read_scope(db_sessionmaker) as session:
        assert job_store.any_queued_job(session) is True
    with session_scope(db_sessionmaker) as session:
        for _ in created:
            job_store.claim_next_job(session, worker_id="w", now=at(0))
    with read_scope(db_sessionmaker) as session:
        assert job_store.any_queued_job(session) is False


def job_rows(session):
    return session.execute(select(Job.__table__).order_by(Job.id)).all()


def test_claim_job_takes_a_queued_job(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
    with session_scope(db_sessionmaker) as session:
        assert job_store.claim_job(session, job_id=job_id, worker_id="w1", now=at(0))
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.worker_id, job.attempts) == ("running", "w1", 1)
        assert (job.started_at, job.heartbeat_at) == (at(0), at(0))


def test_a_second_claim_of_a_running_job_changes_no_row(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        make_job(session)  # a queued bystander, which must not be touched either
    with session_scope(db_sessionmaker) as first:
        assert job_store.claim_job(first, job_id=job_id, worker_id="w1", now=at(0))
    with session_scope(db_sessionmaker) as session:
        before = job_rows(session)

    with session_scope(db_sessionmaker) as second:
        assert not job_store.claim_job(second, job_id=job_id, worker_id="w2", now=at(5))

    with session_scope(db_sessionmaker) as session:
        assert job_rows(session) == before
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.worker_id, job.attempts, job.started_at) == (
            "running",
            "w1",
            1,
            at(0),
        )


@pytest.mark.parametrize("finish", ["cancel", "succeed"])
def test_claim_job_refuses_a_finished_job(db_sessionmaker, make_job, finish):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        if finish == "cancel":
            job_store.request_cancel(session, job_id=job_id, now=at(0))
        else:
            assert job_store.claim_job(session, job_id=job_id, worker_id="w1", now=at(0))
            assert job_store.finish_job(
                session, job_id=job_id, worker_id="w1", status="succeeded", now=at(1)
            )
    with session_scope(db_sessionmaker) as session:
        before = job_rows(session)
    with session_scope(db_sessionmaker) as session:
        assert not job_store.claim_job(session, job_id=job_id, worker_id="w2", now=at(2))
    with session_scope(db_sessionmaker) as session:
        assert job_rows(session) == before


# Only PostgreSQL lets two writing transactions overlap (SQLite's BEGIN IMMEDIATE serializes
# them), so only there can a claim act on a read that another worker's claim made stale.
@pytest.mark.parametrize(
    "database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
def test_a_claim_acting_on_a_stale_read_changes_no_row(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
    with session_scope(db_sessionmaker) as late:
        # Read without a lock, as a worker deciding what to claim might.
        seen = job_store.get_job(late, job_id=job_id)
        assert seen is not None and seen.status == "queued"
        with session_scope(db_sessionmaker) as early:
            assert job_store.claim_job(early, job_id=job_id, worker_id="w1", now=at(0))
        with session_scope(db_sessionmaker) as session:
            before = job_rows(session)
        assert not job_store.claim_job(late, job_id=job_id, worker_id="w2", now=at(5))
    with session_scope(db_sessionmaker) as session:
        assert job_rows(session) == before


def test_datetimes_are_stored_as_instants_and_read_back_in_utc(db_sessionmaker, make_job):
    paris_summer = timezone(timedelta(hours=2))
    local = datetime(2030, 6, 1, 14, 30, 0, 999999, tzinfo=paris_summer)
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        job_store.claim_next_job(session, worker_id="w", now=local)
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None and job.started_at is not None
        assert job.started_at == local
        assert job.started_at.utcoffset() == timedelta(0)
        assert job.started_at.hour == 12
        with pytest.raises(Exception, match="must be timezone-aware"):
            job_store.heartbeat(session, job_id=job_id, worker_id="w", now=datetime(2030, 1, 1))


def test_list_jobs_filters_by_status_newest_first(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        created = [make_job(session).id for _ in range(4)]
        job_store.claim_next_job(session, worker_id="w", now=at(0))  # takes created[0]
    with session_scope(db_sessionmaker) as session:
        everything, total = job_store.list_jobs(session, status=None, limit=10, offset=0)
        assert ([j.id for j in everything], total) == (list(reversed(created)), 4)
        queued, total = job_store.list_jobs(session, status="queued", limit=2, offset=0)
        assert ([j.id for j in queued], total) == ([created[3], created[2]], 3)
        queued, total = job_store.list_jobs(session, status="queued", limit=2, offset=2)
        assert ([j.id for j in queued], total) == ([created[1]], 3)
        running, total = job_store.list_jobs(session, status="running", limit=10, offset=0)
        assert ([j.id for j in running], total) == ([created[0]], 1)
        assert job_store.list_jobs(session, status="failed", limit=10, offset=0) == ([], 0)


def test_cancel_a_queued_job_cancels_it_at_once(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
    with session_scope(db_sessionmaker) as session:
        job = job_store.request_cancel(session, job_id=job_id, now=at(5))
        assert job is not None
        assert (job.status, job.cancel_requested, job.finished_at) == ("cancelled", True, at(5))
        assert job_store.claim_next_job(session, worker_id="w", now=at(6)) is None


def test_cancel_a_running_job_flags_it_for_its_worker(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        make_job(session)  # another worker's business
        job_store.claim_next_job(session, worker_id="w1", now=at(0))
        job_store.claim_next_job(session, worker_id="w2", now=at(0))
        assert job_store.jobs_with_cancel_requested(session, worker_id="w1") == []
    with session_scope(db_sessionmaker) as session:
        job = job_store.request_cancel(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.cancel_requested, job.finished_at) == ("running", True, None)
    with session_scope(db_sessionmaker) as session:
        assert job_store.jobs_with_cancel_requested(session, worker_id="w1") == [job_id]
        assert job_store.jobs_with_cancel_requested(session, worker_id="w2") == []
        assert job_store.finish_job(
            session, job_id=job_id, worker_id="w1", status="cancelled", now=at(1)
        )
        assert job_store.jobs_with_cancel_requested(session, worker_id="w1") == []


@pytest.mark.parametrize("final_status", ["succeeded", "failed", "cancelled"])
def test_cancel_a_finished_job_changes_nothing(db_sessionmaker, make_job, final_status):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        job_store.claim_next_job(session, worker_id="w", now=at(0))
        job_store.finish_job(session, job_id=job_id, worker_id="w", status=final_status, now=at(1))
    with session_scope(db_sessionmaker) as session:
        job = job_store.request_cancel(session, job_id=job_id, now=at(2))
        assert job is not None
        assert (job.status, job.cancel_requested, job.finished_at) == (final_status, False, at(1))
        assert job_store.request_cancel(session, job_id="0" * 32) is None


def test_stale_jobs_are_requeued_then_failed_at_max_attempts(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session, max_attempts=2).id
        fresh_id = make_job(session).id
        job_store.claim_next_job(session, worker_id="w1", now=at(0))
        job_store.claim_next_job(session, worker_id="w2", now=at(0))
        job_store.heartbeat(session, job_id=fresh_id, worker_id="w2", now=at(100))

    with session_scope(db_sessionmaker) as session:
        requeued, failed = job_store.requeue_stale_jobs(session, stale_before=at(60), now=at(120))
        assert (requeued, failed) == ([job_id], [])
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.worker_id, job.heartbeat_at, job.attempts) == (
            "queued",
            None,
            None,
            1,
        )
        fresh = job_store.get_job(session, job_id=fresh_id)
        assert fresh is not None and (fresh.status, fresh.worker_id) == ("running", "w2")
        # The worker that lost the job can no longer write to it.
        assert not job_store.heartbeat(session, job_id=job_id, worker_id="w1", now=at(121))
        assert not job_store.finish_job(
            session, job_id=job_id, worker_id="w1", status="succeeded", now=at(121)
        )

    with session_scope(db_sessionmaker) as session:
        job = job_store.claim_next_job(session, worker_id="w3", now=at(200))
        assert job is not None and (job.id, job.attempts) == (job_id, 2)
        # Heartbeats at t=100 and t=200 are not older than t=100.
        assert job_store.requeue_stale_jobs(session, stale_before=at(100), now=at(300)) == (
            [],
            [],
        )

    with session_scope(db_sessionmaker) as session:
        # Now both are stale: the fresh job has attempts left, the other has used them all.
        requeued, failed = job_store.requeue_stale_jobs(session, stale_before=at(260), now=at(300))
        assert (requeued, failed) == ([fresh_id], [job_id])
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.finished_at) == ("failed", at(300))
        assert job.error == (
            f"worker lost: no heartbeat since {at(200).isoformat()}; gave up after 2 attempts"
        )
        fresh = job_store.get_job(session, job_id=fresh_id)
        assert fresh is not None and (fresh.status, fresh.attempts) == ("queued", 1)


def test_a_stale_job_whose_cancel_was_requested_is_cancelled(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session).id
        job_store.claim_next_job(session, worker_id="w", now=at(0))
        job_store.request_cancel(session, job_id=job_id, now=at(1))
        assert job_store.requeue_stale_jobs(session, stale_before=at(60), now=at(61)) == ([], [])
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.finished_at) == ("cancelled", at(61))


def test_the_database_refuses_an_unknown_status(db_sessionmaker, make_job):
    with pytest.raises(IntegrityError), session_scope(db_sessionmaker) as session:
        job = make_job(session)
        job.status = "lost"
        session.flush()


def test_a_worker_shutting_down_releases_its_running_jobs(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        mine = make_job(session).id
        cancelled = make_job(session).id
        others = make_job(session).id
        finished = make_job(session).id
        for worker in ("w1", "w1", "w2", "w1"):
            job_store.claim_next_job(session, worker_id=worker, now=at(0))
        job_store.update_progress(
            session,
            job_id=mine,
            worker_id="w1",
            fraction=0.5,
            iteration=3,
            candidates=None,
            best_loss=1.5,
            now=at(1),
        )
        job_store.request_cancel(session, job_id=cancelled, now=at(1))
        job_store.finish_job(
            session, job_id=finished, worker_id="w1", status="succeeded", now=at(2)
        )

    with session_scope(db_sessionmaker) as session:
        assert job_store.release_jobs(session, worker_id="w1", now=at(3)) == [mine]

    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=mine)
        assert job is not None
        assert (job.status, job.attempts, job.worker_id, job.heartbeat_at, job.started_at) == (
            "queued",
            0,
            None,
            None,
            None,
        )
        assert (job.progress_fraction, job.progress_iteration, job.progress_best_loss) == (
            0.0,
            None,
            None,
        )
        gone = job_store.get_job(session, job_id=cancelled)
        assert gone is not None and (gone.status, gone.finished_at) == ("cancelled", at(3))
        other = job_store.get_job(session, job_id=others)
        assert other is not None and (other.status, other.worker_id) == ("running", "w2")
        done = job_store.get_job(session, job_id=finished)
        assert done is not None and done.status == "succeeded"
        # The released job is claimed again as a first attempt.
        again = job_store.claim_next_job(session, worker_id="w3", now=at(4))
        assert again is not None and (again.id, again.attempts) == (mine, 1)


def test_jobs_are_counted_by_status(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        assert job_store.count_jobs_by_status(session) == {}
        ids = [make_job(session).id for _ in range(4)]
        job_store.claim_next_job(session, worker_id="w", now=at(0))
        job_store.request_cancel(session, job_id=ids[3], now=at(1))
        assert job_store.count_jobs_by_status(session) == {
            "running": 1,
            "queued": 2,
            "cancelled": 1,
        }


def test_a_k_sweep_job_records_its_k_values_progress_result_and_warnings(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job = make_job(session, n_components=3, k_values=[1, 2, 3])
        job_id = job.id
        assert (job.k_values, job.sweep, job.warnings) == ([1, 2, 3], None, [])
        job_store.claim_next_job(session, worker_id="w1", now=at(0))
        assert job_store.update_progress(
            session,
            job_id=job_id,
            worker_id="w1",
            fraction=0.4,
            iteration=None,
            candidates=None,
            best_loss=None,
            n_components=2,
            now=at(1),
        )
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None and job.progress_n_components == 2
        sweep = {"best_n_components": 2, "models": [{"n_components": 1, "bic": np.float64(0.5)}]}
        assert job_store.finish_job(
            session,
            job_id=job_id,
            worker_id="w1",
            status="succeeded",
            model_id="m" * 32,
            sweep=sweep,
            warnings=["k=3: stopped at max_iter"],
            now=at(2),
        )
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert job.sweep == {"best_n_components": 2, "models": [{"n_components": 1, "bic": 0.5}]}
        assert job.warnings == ["k=3: stopped at max_iter"]


def test_a_requeued_job_forgets_which_k_it_was_fitting(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job_id = make_job(session, n_components=2, k_values=[1, 2]).id
        job_store.claim_next_job(session, worker_id="w1", now=at(0))
        job_store.update_progress(
            session,
            job_id=job_id,
            worker_id="w1",
            fraction=0.6,
            iteration=None,
            candidates=None,
            best_loss=None,
            n_components=2,
            now=at(1),
        )
    with session_scope(db_sessionmaker) as session:
        assert job_store.release_jobs(session, worker_id="w1", now=at(2)) == [job_id]
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=job_id)
        assert job is not None
        assert (job.status, job.progress_fraction, job.progress_n_components) == ("queued", 0, None)
