"""One keyed job fitted by several Procrastinate workers at once, on PostgreSQL.

One stack for the module: the compose ``migrate`` command, one ``api`` process and two
``mixreg worker`` processes of one slot each (the compose command with ``--concurrency 1``, so
the worker running the job's own task and the other one are told apart). A keyed job's shards
are claimed by both workers (``keyed_model_chunks.fitted_by`` names the worker of each); a
worker SIGKILLed while it fits a shard loses only that claim, which the other fits once its
heartbeat is stale; a cancel stops the shard work of every worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from mixreg.datasets import make_shared_accounts
from tests.postgres import empty_postgres_database

from .conftest import FAST_WORKER, REPO
from .test_e2e_keyed import upload
from .test_e2e_scaleout import (
    ApiService,
    WorkerService,
    compose_command,
    compose_environment,
    pid_of,
    process_exists,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SHARD, RATINGS = 50, 24
"""Keys per shard and rows per key: a shard takes a fraction of a second to fit."""


class OneSlotWorker(WorkerService):
    """``mixreg worker --concurrency 1`` in a process group of its own, so that SIGKILL takes
    the worker and its fit processes at once, as ``docker kill`` would."""

    def launch(self) -> None:
        command = compose_command("worker")
        command[command.index("--concurrency") + 1] = "1"
        env = {
            **os.environ,
            **FAST_WORKER,
            **compose_environment("worker"),
            "MIXREG_DATABASE_URL": self.database_url,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@dataclass
class Stack:
    database: Engine
    api: ApiService
    workers: list[OneSlotWorker]
    logs: Path
    url: str

    def add_worker(self) -> OneSlotWorker:
        worker = OneSlotWorker(
            database_url=self.url, log_path=self.logs / f"worker-{len(self.workers)}.log"
        )
        self.workers.append(worker)
        worker.launch()
        return worker

    def live_workers(self) -> int:
        ready = self.api.request("GET", "/readyz")
        assert ready.status_code == 200, ready.text
        workers: int = ready.json()["queue"]["workers"]
        return workers

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.database.connect() as connection:
            return list(connection.execute(text(sql), params).all())

    def keyed_job(self, n_accounts: int, *, max_attempts: int | None = None) -> str:
        """Start a keyed fit of ``n_accounts`` accounts in shards of :data:`SHARD` keys."""
        X, y, account, _ = make_shared_accounts(
            n_accounts=n_accounts, n_ratings=RATINGS, n_features=2, random_state=5
        )
        dataset_id = upload(self.api, X, y, {"account": account.tolist()})
        return self.api.fit(
            {
                "dataset_id": dataset_id,
                "k": 2,
                "split_by": "account",
                "keys_per_shard": SHARD,
                # The global model is not what is tested: a short search.
                "params": {"n_init": 4},
                "time_budget_s": 0.5,
            }
        )

    def claims(self, job_id: str) -> list[tuple[int, str | None, bool]]:
        """(position, claimant, done) of the job's shard claims."""
        return [
            (int(position), claimant, bool(done))
            for position, claimant, done in self.rows(
                "SELECT position, claimed_by, done FROM keyed_job_shard_claims "
                "WHERE job_id = :job ORDER BY position",
                job=job_id,
            )
        ]

    def chunks(self, model_id: str) -> list[tuple[int, int, int, str]]:
        """(position, keys, attempt, worker) of every stored chunk of a keyed model."""
        return [
            (int(position), int(n_keys), int(attempt), str(worker))
            for position, n_keys, attempt, worker in self.rows(
                "SELECT position, n_keys, fitted_attempt, fitted_by FROM keyed_model_chunks "
                "WHERE model_id = :model ORDER BY position",
                model=model_id,
            )
        ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = empty_postgres_database()
    logs = tmp_path_factory.mktemp("keyed-workers")
    environment = {**os.environ, **compose_environment("migrate"), "MIXREG_DATABASE_URL": url}
    migrated = subprocess.run(
        compose_command("migrate"), cwd=REPO, env=environment, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr
    api_command = compose_command("api")
    del api_command[api_command.index("--workers") : api_command.index("--workers") + 2]
    api = ApiService(
        database_url=url,
        log_path=logs / "api.log",
        settings=compose_environment("api"),
        command=api_command,
    )
    database = create_engine(url, poolclass=NullPool)
    stack = Stack(database=database, api=api, workers=[], logs=logs, url=url)
    try:
        api.launch()
        stack.add_worker()
        stack.add_worker()
        api.wait_until_healthy(timeout=120)
        wait_until(lambda: stack.live_workers() == 2, timeout=120, what="two workers")
        yield stack
    finally:
        api.stop()
        api.client.close()
        for worker in stack.workers:
            worker.stop()
        database.dispose()


def running_workers(stack: Stack) -> list[OneSlotWorker]:
    return [w for w in stack.workers if w.process is not None and w.process.poll() is None]


def check_every_key_fitted_once(stack: Stack, job: dict[str, Any], n_accounts: int) -> list:
    assert job["status"] == "succeeded", job
    assert job["keyed"]["keys_by_status"]["fitted"] == n_accounts
    assert job["progress"]["keys_done"] == n_accounts
    chunks = stack.chunks(job["model_id"])
    # Every shard once, with every key once.
    assert [position for position, *_ in chunks] == list(range(n_accounts // SHARD))
    assert sum(keys for _, keys, *_ in chunks) == n_accounts
    lines = stack.api.request("GET", f"/models/{job['model_id']}/keys/{n_accounts - 1}").json()
    assert lines["status"] == "fitted" and lines["n_rows"] == RATINGS
    # The claims went with the job's shards into the model.
    assert stack.claims(job["id"]) == []
    return chunks


def test_two_workers_share_one_keyed_jobs_shards(stack: Stack):
    n_accounts = 16 * SHARD
    job_id = stack.keyed_job(n_accounts)
    job = stack.api.wait_for_job(job_id, timeout=300)
    chunks = check_every_key_fitted_once(stack, job, n_accounts)
    assert job["attempts"] == 1
    fitted_by = {pid_of(worker) for *_, worker in chunks}
    assert fitted_by == {worker.pid for worker in running_workers(stack)}, chunks
    # The job's own worker planned the shards and deferred the shard tasks.
    own = next(w for w in stack.workers if w.pid == pid_of(job["worker_id"]))
    assert f"job {job_id}: " in own.log() and "shard tasks deferred" in own.log()


def test_a_worker_killed_mid_shard_loses_only_that_claim(stack: Stack):
    n_accounts = 16 * SHARD
    job_id = stack.keyed_job(n_accounts)
    job = stack.api.wait_for_job(job_id, until=lambda job: job["status"] == "running")
    job_worker = pid_of(job["worker_id"])
    helper = next(w for w in running_workers(stack) if w.pid != job_worker)

    def held_by_helper() -> list[int]:
        # Shards the other worker holds and has not stored: it is fitting them.
        return [
            position
            for position, claimant, done in stack.claims(job_id)
            if claimant is not None and not done and pid_of(claimant) == helper.pid
        ]

    wait_until(held_by_helper, timeout=120, what="a shard fitted by the other worker")
    helper.kill()
    assert not process_exists(helper.pid)
    killed_mid_shard = held_by_helper()
    assert killed_mid_shard, stack.claims(job_id)
    job = stack.api.wait_for_job(job_id, timeout=300)
    chunks = check_every_key_fitted_once(stack, job, n_accounts)
    # The job itself never lost its worker: one attempt; the shard the killed worker was
    # fitting was fitted by the job's worker once its claim was stale, and stored once.
    assert job["attempts"] == 1
    for position in killed_mid_shard:
        assert pid_of(chunks[position][3]) == job_worker, chunks
    # For the next test: two workers again.
    stack.add_worker()
    wait_until(lambda: stack.live_workers() == 2, timeout=120, what="two workers again")


def test_cancel_stops_every_workers_shards(stack: Stack):
    n_accounts = 30 * SHARD
    job_id = stack.keyed_job(n_accounts)

    def both_fitting() -> bool:
        holders = {
            pid_of(claimant)
            for _, claimant, done in stack.claims(job_id)
            if claimant is not None and not done
        }
        return len(holders) == 2

    wait_until(both_fitting, timeout=120, what="both workers fitting shards")
    assert stack.api.request("POST", f"/jobs/{job_id}/cancel").status_code in (200, 202)
    job = stack.api.wait_for_job(job_id, timeout=60)
    assert job["status"] == "cancelled" and job["model_id"] is None

    def shard_tasks_ended() -> bool:
        doing = stack.rows(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'mixreg.fit_shards' "
            "AND args->>'job_id' = :job AND status IN ('doing', 'todo')",
            job=job_id,
        )
        return doing[0][0] == 0

    # Every worker's shard process sees the cancel at its next heartbeat and stops, storing
    # nothing more: the job's shards and claims went with the cancel and stay gone.
    wait_until(shard_tasks_ended, timeout=30, what="the shard tasks ended")
    time.sleep(1.0)
    assert stack.rows("SELECT count(*) FROM keyed_job_shards WHERE job_id = :job", job=job_id) == [
        (0,)
    ]
    assert stack.claims(job_id) == []


def test_a_keyed_job_reaped_with_a_cancel_pending_leaves_no_shards(stack: Stack):
    n_accounts = 30 * SHARD
    job_id = stack.keyed_job(n_accounts)
    stack.api.wait_for_job(
        job_id, until=lambda job: (job["progress"]["keys_done"] or 0) >= 2 * SHARD, timeout=120
    )
    # Every worker gone mid-job, then the job cancelled: the recovery of the next worker
    # finds its heartbeat stale and ends it.
    for worker in running_workers(stack):
        worker.kill()
    assert stack.rows("SELECT count(*) FROM keyed_job_shards WHERE job_id = :job", job=job_id) != [
        (0,)
    ]
    assert stack.api.request("POST", f"/jobs/{job_id}/cancel").status_code in (200, 202)
    assert stack.api.job(job_id)["status"] == "running"
    stack.add_worker()
    stack.add_worker()
    job = stack.api.wait_for_job(job_id, timeout=120)
    assert job["status"] == "cancelled", job
    assert stack.rows("SELECT count(*) FROM keyed_job_shards WHERE job_id = :job", job=job_id) == [
        (0,)
    ]
    assert stack.claims(job_id) == []
