"""A keyed job through the service on PostgreSQL with 1 and then 2 Procrastinate workers, and
the peak memory of the API and of each worker's processes.

The real commands run as a user runs them (``mixreg db upgrade``, ``mixreg serve``,
``mixreg worker --concurrency 1``) on a database of their own (created and finally dropped on
the server of ``MIXREG_BENCH_POSTGRES_URL``, as ``bench.scaleout`` does). The accounts are
uploaded once (Parquet, the account column kept); the same keyed job (same request and seed)
is then fitted with one worker, and with a second worker started beside it. Peak memory is
each process's high-water mark (``VmHWM`` of ``/proc/<pid>/status``), sampled every 0.2 s for
the worker's fit processes (children of its fork server), which end with their fit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.scaleout import (
    DEFAULT_POSTGRES_URL,
    MIXREG,
    TERMINAL,
    Process,
    bench_database,
    unreachable,
    wait_until,
)
from bench.sections import log
from bench.servers import free_port


def peak_kib(pid: int) -> int:
    """The high-water mark of process ``pid``'s resident memory in KiB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0
    )


def descendants(pid: int, *, min_depth: int = 1) -> list[int]:
    """Every process below ``pid`` (children, their children, ...) at least ``min_depth``
    levels down."""
    found, frontier = [], [(pid, 0)]
    while frontier:
        parent, depth = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                if depth + 1 >= min_depth:
                    found.append(child)
                frontier.append((child, depth + 1))
    return found


@dataclass
class MemoryWatch:
    """The peak memory of a worker process and, separately, of the largest of its fit
    processes (the children of its fork server, two levels down)."""

    pid: int
    own_kib: int = 0
    child_kib: dict[int, int] = field(default_factory=dict)

    fork_server_kib: int = 0
    """The largest direct child: the fork server, which holds the imported libraries only."""

    def sample(self) -> None:
        self.own_kib = max(self.own_kib, peak_kib(self.pid))
        children = set(descendants(self.pid))
        grandchildren = set(descendants(self.pid, min_depth=2))
        for child in children - grandchildren:
            self.fork_server_kib = max(self.fork_server_kib, peak_kib(child))
        for child in grandchildren:
            self.child_kib[child] = max(self.child_kib.get(child, 0), peak_kib(child))

    @property
    def largest_child_mib(self) -> float:
        return max(self.child_kib.values(), default=0) / 1024

    @property
    def own_mib(self) -> float:
        return self.own_kib / 1024


@dataclass(frozen=True)
class JobRun:
    n_workers: int
    seconds: float
    shard_seconds: float
    """From the first poll that saw the keys counted (the global model done, the shards
    planned) to the job's success."""
    job: dict[str, Any]
    workers: list[MemoryWatch]
    job_worker_pid: int
    shards_by_worker: dict[int, int]


def _shards_by_worker(database_url: str, model_id: str) -> dict[int, int]:
    import psycopg
    from sqlalchemy import make_url

    conninfo = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(conninfo) as connection:
        rows = connection.execute(
            "SELECT fitted_by, count(*) FROM keyed_model_chunks WHERE model_id = %s "
            "GROUP BY fitted_by",
            (model_id,),
        ).fetchall()
    return {int(str(worker).split(":")[1]): int(count) for worker, count in rows}


@contextlib.contextmanager
def service(
    database_url: str, folder: Path, settings: dict[str, str] | None = None
) -> Iterator[tuple[httpx.Client, Process, dict]]:
    """The API (``mixreg serve``, Procrastinate queue) on an upgraded empty database, with the
    ``MIXREG_*`` ``settings`` given (for its workers too)."""
    env = {
        **os.environ,
        "MIXREG_DATABASE_URL": database_url,
        "MIXREG_WORKER": "procrastinate",
        # The fit of 10^5 accounts loads 2 x 10^7 rows: no time limit in the way.
        "MIXREG_JOB_TIME_LIMIT_S": "86400",
        "MIXREG_LOAD_TIME_LIMIT_S": "3600",
        "MIXREG_MAX_UPLOAD_BYTES": str(8 * 1024**3),
        "MIXREG_MAX_ROWS": str(10**8),
        "MIXREG_MAX_DECODED_BYTES": str(16 * 1024**3),
        **(settings or {}),
    }
    import subprocess

    subprocess.run([MIXREG, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    api = Process(
        ["serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env,
        log_path=folder / "api.log",
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=3600)
    try:
        wait_until(
            lambda: client.get("/readyz").status_code == 200,
            timeout=180,
            what="the API is ready",
            processes=[api],
        )
        yield client, api, env
    finally:
        client.close()
        api.stop()


def upload_accounts(
    client: httpx.Client, X: np.ndarray, y: np.ndarray, account: np.ndarray, folder: Path
) -> str:
    """Upload the accounts as a Parquet file, the account column kept; the dataset id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {f"e{index + 1}": X[:, index] for index in range(X.shape[1])}
    table = pa.table({**columns, "account": account, "rating": y})
    path = folder / "accounts.parquet"
    pq.write_table(table, path)
    with path.open("rb") as body:
        response = client.post(
            "/datasets",
            files={"file": ("accounts.parquet", body, "application/vnd.apache.parquet")},
            data={"target": "rating", "keep": "account"},
        )
    response.raise_for_status()
    path.unlink()
    return str(response.json()["id"])


def run_job(
    client: httpx.Client,
    request: dict[str, Any],
    workers: list[Process],
    database_url: str,
) -> JobRun:
    """Submit the keyed job, wait for it while sampling the workers' memory."""
    watches = [MemoryWatch(worker.process.pid) for worker in workers]
    started = time.perf_counter()
    response = client.post("/fit", json=request)
    response.raise_for_status()
    job_id = response.json()["job_id"]
    shards_started: float | None = None
    while True:
        for watch in watches:
            watch.sample()
        for worker in workers:
            worker.check_alive()
        job = client.get(f"/jobs/{job_id}").json()
        if shards_started is None and job["progress"].get("n_keys"):
            shards_started = time.perf_counter()
        if job["status"] in TERMINAL:
            break
        time.sleep(0.2)
    finished = time.perf_counter()
    seconds = finished - started
    if job["status"] != "succeeded":
        raise RuntimeError(f"the keyed job ended {job['status']}: {job.get('error')}")
    return JobRun(
        n_workers=len(workers),
        seconds=seconds,
        shard_seconds=finished - (finished if shards_started is None else shards_started),
        job=job,
        workers=watches,
        job_worker_pid=int(str(job["worker_id"]).split(":")[1]),
        shards_by_worker=_shards_by_worker(database_url, job["model_id"]),
    )


@dataclass(frozen=True)
class WorkersOutcome:
    runs: list[JobRun]
    api_peak_mib: float
    upload_seconds: float
    keys_per_shard: int


def measure(
    X: np.ndarray,
    y: np.ndarray,
    account: np.ndarray,
    *,
    keys_per_shard: int,
    worker_counts: tuple[int, ...] = (1, 2),
    global_rows: int | None = None,
) -> WorkersOutcome | str:
    """The same keyed job with each of ``worker_counts`` workers in turn (the global model on
    at most ``global_rows`` rows; default, the service's); a sentence instead if PostgreSQL is
    not reachable."""
    server_url = os.environ.get("MIXREG_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    reason = unreachable(server_url)
    if reason is not None:
        return reason
    # The app measured before configured logging: its client's line per request is noise here.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    request = {
        "k": 2,
        "split_by": "account",
        "keys_per_shard": keys_per_shard,
        "seed": 0,
        # The job's global model (for unknown keys) is the same in both runs: a short search.
        "time_budget_s": 10,
    }
    with (
        tempfile.TemporaryDirectory(prefix="mixreg-bench-keyed-workers-") as name,
        bench_database(server_url, "mixreg_bench_keyed") as database_url,
        service(
            database_url,
            Path(name),
            {} if global_rows is None else {"MIXREG_KEYED_GLOBAL_ROWS": str(global_rows)},
        ) as (client, api, env),
    ):
        folder = Path(name)
        log(f"uploading {len(y):,} rows")
        started = time.perf_counter()
        dataset_id = upload_accounts(client, X, y, account, folder)
        upload_seconds = time.perf_counter() - started
        request["dataset_id"] = dataset_id
        runs = []
        for n_workers in worker_counts:
            # Fresh workers for each run, so that each high-water mark is this run's.
            workers = [
                Process(
                    ["worker", "--concurrency", "1"],
                    env=env,
                    log_path=folder / f"worker-{n_workers}-{index}.log",
                )
                for index in range(n_workers)
            ]
            try:
                wait_until(
                    lambda n=n_workers: client.get("/readyz").json()["queue"]["workers"] == n,
                    timeout=180,
                    what=f"{n_workers} workers",
                    processes=workers,
                )
                log(f"the keyed job with {n_workers} worker(s)")
                runs.append(run_job(client, request, workers, database_url))
            finally:
                for worker in workers:
                    worker.stop()
            # The stopped workers' heartbeats must be gone before the next run counts workers.
            wait_until(
                lambda: client.get("/readyz").json()["queue"]["workers"] == 0,
                timeout=180,
                what="no worker left",
                processes=[api],
            )
        api_peak = peak_kib(api.process.pid) / 1024
    return WorkersOutcome(
        runs=runs,
        api_peak_mib=api_peak,
        upload_seconds=upload_seconds,
        keys_per_shard=keys_per_shard,
    )
