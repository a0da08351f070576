"""Scale-out on Procrastinate: the commands of docker-compose.yml, run natively on PostgreSQL.

One stack for the module: the ``migrate`` command once, then two ``api`` processes (each the
compose command, ``mixreg serve --workers 2``) and two ``mixreg worker`` processes, all with
the compose file's environment (``MIXREG_WORKER=procrastinate``) on the test database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from tests.postgres import empty_postgres_database

from .conftest import FAST_WORKER, REPO, TERMINAL, Server, mixture_data
from .test_e2e_jobs import is_fitting
from .test_e2e_keyed import (
    KILLED_ACCOUNTS,
    check_every_key_fitted_once,
    killed_mid_keyed_fit,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
MIXREG = str(Path(sys.executable).parent / "mixreg")


def compose_command(service: str) -> list[str]:
    """The service's command, for this machine: the venv's ``mixreg``, bound to 127.0.0.1 on
    the port the test picks ("{port}"; in the container MIXREG_PORT sets it)."""
    command = [
        MIXREG if part == "mixreg" else part for part in COMPOSE["services"][service]["command"]
    ]
    if "serve" in command and "--port" not in command:
        command += ["--port", "{port}"]
    for option, value in (("--host", "127.0.0.1"), ("--port", "{port}")):
        if option in command:
            command[command.index(option) + 1] = value
    return command


# Settings of the containers that do not apply here: the test database replaces the URL, and
# the API key file is a path inside the api container (the tests talk to 127.0.0.1, which
# needs no key when none is configured).
CONTAINER_ONLY = ("MIXREG_DATABASE_URL", "MIXREG_API_KEYS_FILE", "MIXREG_DATABASE_PASSWORD_FILE")


def compose_environment(service: str) -> dict[str, str]:
    """The service's environment, without the container-only settings."""
    environment = COMPOSE["services"][service]["environment"]
    return {name: str(value) for name, value in environment.items() if name not in CONTAINER_ONLY}


def long_fit(*, seconds: float) -> dict[str, Any]:
    """A sub-sample search with far more partitions than it can try: it runs until its time
    budget, however fast the machine (EM restarts converge: faster EM ended such a fit early).
    The APIs allow that many partitions (``LONG_FITS_ALLOWED``)."""
    X, y = mixture_data(n_rows=120)
    return {
        "data": {"X": X.tolist(), "y": y.tolist()},
        "k": 2,
        "algorithm": "subsample",
        "params": {"n_partitions": 10**9, "subsample_size": 30},
        "time_budget_s": seconds,
    }


LONG_FITS_ALLOWED = {"MIXREG_MAX_N_PARTITIONS": str(10**9)}


def small_fit(seed: int) -> dict[str, Any]:
    X, y = mixture_data(n_rows=80)
    return {
        "data": {"X": X.tolist(), "y": y.tolist()},
        "k": 2,
        "seed": seed,
        "params": {"n_init": 4, "n_partitions": 50, "subsample_size": 20, "max_iter": 20},
    }


def wait_until(condition: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def pid_of(worker_id: str | None) -> int:
    """The process id in a worker id ``host:pid:random``."""
    assert worker_id is not None
    return int(worker_id.split(":")[1])


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` is alive (an exited process not yet reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ApiService(Server):
    """The compose ``api`` command as a process group, so SIGKILL takes all its processes, as
    ``docker kill`` would."""

    def popen_options(self) -> dict[str, Any]:
        return {"start_new_session": True}

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None


@dataclass
class WorkerService:
    """The compose ``worker`` command (``mixreg worker``)."""

    database_url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def launch(self) -> None:
        env = {
            **os.environ,
            **FAST_WORKER,
            **compose_environment("worker"),
            "MIXREG_DATABASE_URL": self.database_url,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                compose_command("worker"), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def fit_process_of(self, job_id: str) -> int:
        """The fit process of ``job_id``, from the worker's log."""
        found = re.search(
            rf"job {job_id} started \(.*\) by worker \S+ in process (\d+)", self.log()
        )
        assert found is not None, self.log()
        return int(found.group(1))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Stack:
    database: Engine
    apis: list[ApiService]
    workers: list[WorkerService]
    make_worker: Callable[[], WorkerService]

    @property
    def api(self) -> ApiService:
        return self.apis[0]

    def worker_of(self, job: dict[str, Any]) -> WorkerService:
        return next(worker for worker in self.workers if worker.pid == pid_of(job["worker_id"]))

    def live_workers(self) -> int:
        ready = self.api.request("GET", "/readyz")
        assert ready.status_code == 200, ready.text
        workers: int = ready.json()["queue"]["workers"]
        return workers

    def wait_for_jobs(self, job_ids: list[str], timeout: float = 120) -> list[dict[str, Any]]:
        def finished() -> list[dict[str, Any]] | None:
            jobs = [self.api.job(job_id) for job_id in job_ids]
            return jobs if all(job["status"] in TERMINAL for job in jobs) else None

        result: list[dict[str, Any]] = wait_until(finished, timeout=timeout, what="jobs finished")
        return result

    def unfinished_jobs(self) -> int:
        with self.database.connect() as connection:
            return int(
                connection.scalar(
                    text("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
                )
            )

    def wait_for_task(self, job_id: str, status: str) -> None:
        """Wait until the job's task reaches ``status`` (it ends just after its job)."""
        wait_until(
            lambda: self.task_of(job_id)["status"] == status,
            timeout=30,
            what=f"task of job {job_id} {status}",
        )

    def task_of(self, job_id: str) -> dict[str, Any]:
        """The job's task in Procrastinate's table; there must be exactly one."""
        with self.database.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT t.id, t.status, t.task_name, j.task_id FROM procrastinate_jobs t "
                    "JOIN jobs j ON j.id = t.args->>'job_id' WHERE j.id = :job_id"
                ),
                {"job_id": job_id},
            ).all()
        assert len(rows) == 1, rows
        task_id, status, task_name, recorded = rows[0]
        assert (task_name, recorded) == ("mixreg.fit", task_id)
        return {"id": task_id, "status": status}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = empty_postgres_database()
    logs = tmp_path_factory.mktemp("scaleout")
    environment = {**os.environ, **compose_environment("migrate"), "MIXREG_DATABASE_URL": url}
    migrated = subprocess.run(
        compose_command("migrate"), cwd=REPO, env=environment, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr
    # The first API is the compose command as it is (two processes); the second is one process
    # that queues jobs with a single attempt, so a job of it fails once its worker is lost.
    single = compose_command("api")
    del single[single.index("--workers") : single.index("--workers") + 2]
    apis = [
        ApiService(
            database_url=url,
            log_path=logs / "api-0.log",
            settings={**compose_environment("api"), **LONG_FITS_ALLOWED},
            command=compose_command("api"),
        ),
        ApiService(
            database_url=url,
            log_path=logs / "api-1.log",
            settings={
                **compose_environment("api"),
                **LONG_FITS_ALLOWED,
                "MIXREG_MAX_ATTEMPTS": "1",
            },
            command=single,
        ),
    ]
    workers: list[WorkerService] = []

    def make_worker() -> WorkerService:
        worker = WorkerService(database_url=url, log_path=logs / f"worker-{len(workers)}.log")
        workers.append(worker)
        worker.launch()
        return worker

    database = create_engine(url, poolclass=NullPool)
    stack = Stack(database=database, apis=apis, workers=workers, make_worker=make_worker)
    try:
        for api in apis:
            api.launch()
        make_worker()
        make_worker()
        for api in apis:
            api.wait_until_healthy(timeout=120)
        wait_until(lambda: stack.live_workers() == 2, timeout=120, what="two workers")
        yield stack
    finally:
        for api in apis:
            api.stop()
            api.client.close()
        for worker in workers:
            worker.stop()
        database.dispose()


def test_twenty_fits_at_once_run_on_both_workers_and_never_in_the_api(stack: Stack):
    with ThreadPoolExecutor(max_workers=8) as pool:
        job_ids = list(pool.map(lambda seed: stack.api.fit(small_fit(seed)), range(20)))

    jobs = stack.wait_for_jobs(job_ids)

    assert [job["status"] for job in jobs] == ["succeeded"] * 20, jobs
    ran_on = {pid_of(job["worker_id"]) for job in jobs}
    assert ran_on == {worker.pid for worker in stack.workers[:2]}
    for api in stack.apis:
        assert "started (" not in api.log()  # the API processes started no fit
    for job_id in job_ids:
        stack.wait_for_task(job_id, "succeeded")


def test_cancel_stops_the_fit_on_its_worker(stack: Stack):
    job_id = stack.api.fit(long_fit(seconds=3000))
    job = stack.api.wait_for_job(job_id, is_fitting)
    fit_process = stack.worker_of(job).fit_process_of(job_id)
    assert process_exists(fit_process)

    response = stack.api.request("POST", f"/jobs/{job_id}/cancel")

    assert response.status_code == 202
    job = stack.api.wait_for_job(job_id, timeout=30)
    assert (job["status"], job["model_id"]) == ("cancelled", None)
    wait_until(lambda: not process_exists(fit_process), timeout=10, what="fit process gone")
    stack.wait_for_task(job_id, "aborted")


def test_a_model_deleted_through_one_api_is_gone_from_the_others(stack: Stack):
    serving, deleting = stack.apis
    model_id = serving.wait_for_job(serving.fit(small_fit(seed=99)))["model_id"]
    X, _ = mixture_data(n_rows=5)
    body = {"model_id": model_id, "X": X.tolist()}

    def predict() -> int:
        # A new connection each time, so both processes of the first API answer in turn.
        return httpx.post(f"{serving.base_url}/predict", json=body, timeout=30).status_code

    # Every process of the first API has the model in its cache.
    assert [predict() for _ in range(12)] == [200] * 12

    assert deleting.request("DELETE", f"/models/{model_id}").status_code == 204

    recent: list[int] = []

    def gone_everywhere() -> bool:
        recent.append(predict())
        return recent[-6:] == [404] * 6

    wait_until(gone_everywhere, timeout=2, what="the other API answers 404")


def test_an_api_killed_mid_burst_and_restarted_loses_or_duplicates_no_job(stack: Stack):
    api = stack.api
    before = [api.fit(small_fit(seed)) for seed in range(100, 104)]
    answered: list[str] = []

    def submit(seed: int) -> None:
        try:
            response = httpx.post(f"{api.base_url}/fit", json=small_fit(seed), timeout=30)
        except httpx.TransportError:
            return  # the API died under this request: it may or may not have been queued
        if response.status_code == 202:
            answered.append(response.json()["job_id"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        pending = [pool.submit(submit, seed) for seed in range(200, 212)]
        wait_until(lambda: len(answered) >= 2, timeout=60, what="first answers")
        api.kill()
        for future in pending:
            future.result()
    api.start(timeout=120)
    after = [api.fit(small_fit(seed)) for seed in range(300, 304)]
    wait_until(lambda: stack.unfinished_jobs() == 0, timeout=180, what="every job finished")

    acknowledged = before + answered + after
    for job in stack.wait_for_jobs(acknowledged):
        assert (job["status"], job["attempts"]) == ("succeeded", 1), job
    with stack.database.connect() as connection:
        # Every committed job has exactly one task, every task has its job, no job ran twice.
        jobs_without_one_task = connection.scalar(
            text(
                "SELECT count(*) FROM jobs j WHERE j.task_id IS NULL OR (SELECT count(*) FROM "
                "procrastinate_jobs t WHERE t.args->>'job_id' = j.id) <> 1"
            )
        )
        tasks_without_job = connection.scalar(
            text(
                "SELECT count(*) FROM procrastinate_jobs t LEFT JOIN jobs j "
                "ON j.id = t.args->>'job_id' WHERE j.id IS NULL"
            )
        )
        jobs_with_models = connection.execute(
            text(
                "SELECT j.id, count(m.id) FROM jobs j LEFT JOIN models m ON m.job_id = j.id "
                "WHERE j.id = ANY(:ids) GROUP BY j.id"
            ),
            {"ids": acknowledged},
        ).all()
    assert (jobs_without_one_task, tasks_without_job) == (0, 0)
    assert sorted(jobs_with_models) == sorted((job_id, 1) for job_id in acknowledged)


def test_a_worker_killed_mid_fit_loses_no_job(stack: Stack):
    # The long fit first, so that the short one is still fitting when the workers are killed.
    single_attempt = stack.apis[1].fit(long_fit(seconds=30))
    stack.api.wait_for_job(single_attempt, is_fitting)
    retried = stack.apis[0].fit(long_fit(seconds=4))
    stack.api.wait_for_job(retried, is_fitting)
    running = [stack.api.job(job_id) for job_id in (retried, single_attempt)]
    killed = {stack.worker_of(job).pid: stack.worker_of(job) for job in running}
    fit_processes = [stack.worker_of(job).fit_process_of(job["id"]) for job in running]

    for worker in killed.values():
        os.kill(worker.pid, signal.SIGKILL)
    survivor = stack.make_worker()

    first, second = stack.wait_for_jobs([retried, single_attempt])
    assert (first["status"], first["attempts"]) == ("succeeded", 2), first
    assert pid_of(first["worker_id"]) not in killed
    assert (second["status"], second["attempts"]) == ("failed", 1), second
    assert second["error"].startswith("worker lost: no heartbeat since ")
    assert stack.unfinished_jobs() == 0
    stack.wait_for_task(retried, "succeeded")
    stack.wait_for_task(single_attempt, "failed")
    for fit_process in fit_processes:
        wait_until(
            lambda pid=fit_process: not process_exists(pid), timeout=10, what="orphan fit ended"
        )
    assert survivor.process is not None and survivor.process.poll() is None


# Run alone, this test starts the module's stack (two APIs, two workers) within its time.
@pytest.mark.timeout(600)
def test_a_worker_killed_mid_keyed_fit_loses_only_its_unstored_shards(stack: Stack):
    def kill_its_worker(job: dict[str, Any]) -> None:
        os.kill(stack.worker_of(job).pid, signal.SIGKILL)
        stack.make_worker()

    job = killed_mid_keyed_fit(stack.api, kill_its_worker, KILLED_ACCOUNTS)
    url = stack.database.url.render_as_string(hide_password=False)
    check_every_key_fitted_once(stack.api, job, url, KILLED_ACCOUNTS, retry_fits_the_last=False)
    assert stack.unfinished_jobs() == 0
