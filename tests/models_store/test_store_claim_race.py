"""Many workers claiming from one queue at once: every job is claimed exactly once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from models_store import jobs as job_store
from models_store.session import make_engine, make_sessionmaker, session_scope

N_JOBS = 20
N_CLAIMERS = 8


def test_racing_claimers_claim_every_job_exactly_once(
    migrated_database_url, db_sessionmaker, make_job
):
    with session_scope(db_sessionmaker) as session:
        job_ids = {make_job(session).id for _ in range(N_JOBS)}

    start = threading.Barrier(N_CLAIMERS)
    claims: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def claim_until_empty(worker_id: str) -> None:
        # Each claimer has its own engine and connections, as a separate worker process would.
        engine = make_engine(migrated_database_url)
        factory = make_sessionmaker(engine)
        claimed: list[str] = []
        try:
            start.wait(timeout=30)
            while True:
                with session_scope(factory) as session:
                    job = job_store.claim_next_job(
                        session, worker_id=worker_id, now=datetime.now(UTC)
                    )
                    if job is None:
                        break
                    claimed.append(job.id)
        except BaseException as exc:  # reported to the test thread below
            errors.append(exc)
        finally:
            engine.dispose()
            claims[worker_id] = claimed

    threads = [
        threading.Thread(target=claim_until_empty, args=(f"worker-{i}",)) for i in range(N_CLAIMERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    all_claims = [job_id for claimed in claims.values() for job_id in claimed]
    assert len(all_claims) == N_JOBS
    assert set(all_claims) == job_ids

    owner = {job_id: worker for worker, claimed in claims.items() for job_id in claimed}
    with session_scope(db_sessionmaker) as session:
        jobs, total = job_store.list_jobs(session, status="running", limit=N_JOBS, offset=0)
        assert total == N_JOBS
        for job in jobs:
            assert (job.worker_id, job.attempts) == (owner[job.id], 1)
