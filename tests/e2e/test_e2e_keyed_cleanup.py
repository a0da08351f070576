"""A keyed job that ends without a model leaves no shards and no shard claims behind, on the
embedded worker, whether it is cancelled, fails (its fit process killed) or is reaped (its server
killed, no attempt left); deleting its dataset afterwards finds nothing of it either."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from mixreg.datasets import make_shared_accounts

from .conftest import Server, ServerFactory
from .test_e2e_keyed import upload
from .test_e2e_parser_recovery import descendants

pytestmark = pytest.mark.e2e

SHARD, RATINGS = 50, 24


@pytest.fixture
def database(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def shard_rows(database: Engine, job_id: str) -> tuple[int, int]:
    """(stored shards, shard claims) of ``job_id``."""
    with database.connect() as connection:
        shards = connection.execute(
            text("SELECT count(*) FROM keyed_job_shards WHERE job_id = :job"), {"job": job_id}
        ).scalar_one()
        claims = connection.execute(
            text("SELECT count(*) FROM keyed_job_shard_claims WHERE job_id = :job"),
            {"job": job_id},
        ).scalar_one()
    return int(shards), int(claims)


def keyed_job_under_way(
    server: Server, database: Engine, n_accounts: int = 12 * SHARD
) -> tuple[str, str]:
    """(dataset id, job id) of a keyed fit in shards of :data:`SHARD` keys, returned once
    two of its shards are stored."""
    X, y, account, _ = make_shared_accounts(
        n_accounts=n_accounts, n_ratings=RATINGS, n_features=2, random_state=3
    )
    dataset_id = upload(server, X, y, {"account": account.tolist()})
    job_id = server.fit(
        {
            "dataset_id": dataset_id,
            "k": 2,
            "split_by": "account",
            "keys_per_shard": SHARD,
            "params": {"n_init": 4},
            "time_budget_s": 0.2,
        }
    )
    job = server.wait_for_job(
        job_id, until=lambda job: shard_rows(database, job_id)[0] >= 2, timeout=200
    )
    assert job["status"] == "running", job
    return dataset_id, job_id


def assert_nothing_left(server: Server, database: Engine, dataset_id: str, job_id: str) -> None:
    assert shard_rows(database, job_id) == (0, 0)
    assert server.request("DELETE", f"/datasets/{dataset_id}").status_code == 204
    assert shard_rows(database, job_id) == (0, 0)


def test_keyed_jobs_that_end_without_a_model_leave_no_shards(
    make_server: ServerFactory, database: Engine
):
    # One attempt per job, so that the job of a killed server is reaped as failed.
    server = make_server(MIXREG_MAX_ATTEMPTS="1")

    # Cancelled.
    dataset_id, job_id = keyed_job_under_way(server, database)
    assert server.request("POST", f"/jobs/{job_id}/cancel").status_code in (200, 202)
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "cancelled", job
    assert_nothing_left(server, database, dataset_id, job_id)

    # Failed: its fit process killed (the children of the server's fork server), as the
    # kernel's OOM killer would end it.
    dataset_id, job_id = keyed_job_under_way(server, database)
    assert server.process is not None
    for pid in descendants(server.process.pid, min_depth=2):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "failed", job
    assert_nothing_left(server, database, dataset_id, job_id)

    # Reaped: its server killed, no attempt left.
    dataset_id, job_id = keyed_job_under_way(server, database)
    server.kill()
    server.start()
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "failed" and "worker lost" in job["error"], job
    assert_nothing_left(server, database, dataset_id, job_id)
