"""Load on loopback: concurrent clients mixing single-row predicts, small fits and listings.

A real server (uvicorn, embedded worker) is started on SQLite and on PostgreSQL, with API keys
required. ``--clients`` clients send requests for ``--duration`` seconds (and at most
``--max-requests`` in all), each ``--rate`` requests per second on a fixed schedule (a
request's latency counts from its slot, so a slow answer delays and counts against the ones
after it), or back to back with ``--rate 0`` (saturation: latency is then the length of the
server's queue, 32 clients over its throughput); afterwards every job submitted is waited
for, and the run checks what must hold under load:

- no response is a 5xx;
- no job is lost (every accepted ``POST /fit`` names a job that exists and finishes) or
  duplicated (the jobs in the database are exactly the accepted ones, each succeeded job has
  exactly one model), and every job is final at the end;
- with ``--kill-at S``, the server is killed (SIGKILL) after S seconds and started again: the
  fits it was running are retried once (two attempts), and retried submissions (same
  ``Idempotency-Key``) create no second job.

With ``--big-bodies``, the clients first run ``--duration`` seconds as above; then, while they
go on, a 1,000,000 x 20 CSV upload and a 64 MiB JSON dataset body are sent at once, and a
dataset whose load takes longer than ``MIXREG_STALE_AFTER_S`` (0.4 s here, two heartbeats)
is fitted — on PostgreSQL the CSV's, on SQLite (which reads a million rows in 0.3 s) a
``--slow-rows`` x 20 one stored before the clients start: no
error, no requeue, nothing lost, and the latencies of the operations during the big bodies
(reported as "… during big bodies") are compared with those before.

Latencies (p50, p99) are per operation. ``--write`` records the tables in ``bench/RESULTS.md``
between ``<!-- load:start -->`` and ``<!-- load:end -->``. Run with
``python -m bench.load [--duration 60] [--clients 32]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from bench.sections import machine_lines, write_section
from bench.servers import ServerProcess
from models_store import datasets as dataset_store
from models_store.session import make_engine, make_sessionmaker, read_scope
from service.auth.keys import add_key, new_key

# The app as the tests serve it, quiet but for warnings (the load makes many requests).
UVICORN_APP = [
    *(sys.executable, "-m", "uvicorn", "--factory", "service.main:create_app"),
    *("--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"),
]
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "load"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
OPERATIONS = ("predict", "fit", "job", "list jobs", "list models", "list datasets")
# Share of each operation in a client's loop (the rest are predicts).
FIT_SHARE = 0.05
JOB_SHARE = 0.10
LIST_SHARE = 0.20
PREDICT_SHARE = 1 - FIT_SHARE - JOB_SHARE - LIST_SHARE
# Each listing is an operation of its own: GET /jobs has targets of its own.
LIST_PATHS = {
    "list jobs": "/jobs?limit=20",
    "list models": "/models?limit=20",
    "list datasets": "/datasets?limit=20",
}
JOBS_P99_TARGET_S = 0.100
"""``GET /jobs`` p99 without big bodies must stay under this."""
DURING_RATIO_TARGET = 2.0
"""The p99 of predicts and of ``GET /jobs`` during big bodies: at most this times before."""

# The worker's rhythm of the e2e tests: a killed server's fits are retried within seconds.
SERVER_SETTINGS = {
    "MIXREG_HEARTBEAT_INTERVAL_S": "0.2",
    "MIXREG_STALE_AFTER_S": "2",
    "MIXREG_POLL_INTERVAL_S": "0.05",
    "MIXREG_PROGRESS_INTERVAL_S": "0.1",
    "MIXREG_WORKER_CONCURRENCY": "2",
}


DEFAULT_RATE = 2.0
"""Requests per second each client sends by default, on a fixed schedule (0: back to back)."""
WARMUP_S = 5.0
"""Seconds of load before the timed phase (the first fits start the fork server and the
first requests fill the caches): their requests are checked, not timed."""
SLOW_ROWS = 5_000_000
"""Rows (20 features) of the dataset fitted during the big bodies on SQLite, where the CSV's
1,000,000 rows load in 0.3 s: enough that reading it back takes longer than
``MIXREG_STALE_AFTER_S``."""


@dataclass(frozen=True)
class LoadConfig:
    """Sizes of one run."""

    duration_s: float = 60.0
    clients: int = 32
    max_requests: int = 500_000
    kill_at_s: float | None = None
    max_queued_jobs: int = 100
    drain_timeout_s: float = 180.0
    seed: int = 0
    big_bodies: bool = False
    rate: float = DEFAULT_RATE
    slow_rows: int = SLOW_ROWS
    warmup_s: float = WARMUP_S


@dataclass
class Tally:
    """What the clients saw."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    unavailable: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    accepted_jobs: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    # Submissions left without an answer (the server was down): key -> body, to send again.
    unanswered_fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: int = 0

    def record(self, operation: str, status: int, seconds: float, detail: str) -> None:
        self.requests += 1
        self.statuses[operation][status] += 1
        if status >= 500:
            self.server_errors.append(f"{operation} {status}: {detail[:300]}")
        elif status < 400:
            self.latencies[operation].append(seconds)


@dataclass
class Outcome:
    """The checks after a run."""

    backend: str
    config: LoadConfig
    tally: Tally
    wall_s: float
    jobs_accepted: int
    jobs_in_database: int
    jobs_by_status: Counter[str]
    lost_jobs: list[str]
    duplicated_jobs: list[str]
    unfinished_jobs: list[str]
    models_per_job_wrong: list[str]
    killed_running_jobs: list[str]
    not_retried_once: list[str]
    big: BigBodies | None = None
    requeued_jobs: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Everything that must not happen; empty when the run holds."""
        found = []
        if self.tally.server_errors:
            found.append(f"{len(self.tally.server_errors)} 5xx: {self.tally.server_errors[:3]}")
        for name in (
            "lost_jobs",
            "duplicated_jobs",
            "unfinished_jobs",
            "models_per_job_wrong",
            "not_retried_once",
            "requeued_jobs",
        ):
            values = getattr(self, name)
            if values:
                found.append(f"{name.replace('_', ' ')}: {values[:5]}")
        if self.big is not None:
            found += self.big.problems
        return found


DURING = " during big bodies"
"""Suffix of the operations timed while the big bodies are sent."""
WARM_UP = " warm-up"
"""Suffix of the operations sent during the warm-up (not in the tables)."""
CSV_ROWS, CSV_FEATURES = 1_000_000, 20
JSON_BODY_BYTES = 64 * 1024 * 1024
# The slow load: the dataset fitted during the big bodies must load for longer than this.
BIG_BODIES_STALE_AFTER_S = "0.4"


@dataclass
class BigBodies:
    """What the big bodies did."""

    csv_bytes: int = 0
    json_bytes: int = 0
    csv_upload_s: float = 0.0
    json_upload_s: float = 0.0
    fit_s: float = 0.0
    fit_job: dict[str, Any] = field(default_factory=dict)
    load_s: float = 0.0
    slow_upload_s: float = 0.0
    fitted_rows: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Errors of the big requests; a fit that did not succeed at its first attempt."""
        found = list(self.errors)
        job = self.fit_job
        if job and (job.get("status"), job.get("attempts")) != ("succeeded", 1):
            found.append(
                f"the fit of the big dataset ended {job.get('status')} after "
                f"{job.get('attempts')} attempts: {job.get('error')}"
            )
        return found


def big_files(workdir: Path) -> tuple[Path, Path]:
    """A 1,000,000 x 20 CSV (column ``y`` the target) and a JSON dataset body just under
    64 MiB, written once per run."""
    csv_path, json_path = workdir / "big.csv", workdir / "big.json"
    rng = np.random.default_rng(17)
    if not csv_path.exists():
        with csv_path.open("w") as out:
            out.write(",".join([*(f"x{j}" for j in range(CSV_FEATURES)), "y"]) + "\n")
            for _ in range(CSV_ROWS // 100_000):
                block = rng.standard_normal((100_000, CSV_FEATURES + 1)).round(5)
                np.savetxt(out, block, delimiter=",", fmt="%.5f")
    if not json_path.exists():
        row = rng.standard_normal(CSV_FEATURES).round(5).tolist()
        per_row = len(str(row)) + 2 + 10  # a row of X, its y and separators
        n_rows = int(JSON_BODY_BYTES * 0.98) // per_row
        while True:
            X = rng.standard_normal((n_rows, CSV_FEATURES)).round(5)
            y = (X[:, 0] - X[:, 1]).round(5)
            body = json.dumps({"X": X.tolist(), "y": y.tolist(), "name": "big json"})
            if len(body) <= JSON_BODY_BYTES:
                break
            n_rows = int(n_rows * 0.99 * JSON_BODY_BYTES / len(body))
        json_path.write_text(body)
    return csv_path, json_path


def slow_file(workdir: Path, n_rows: int) -> Path:
    """An ``.npz`` archive of ``n_rows`` x 20 rows (``X`` and ``y``), written once per run: the
    dataset whose load outlasts ``MIXREG_STALE_AFTER_S``, uploaded before the clients start."""
    path = workdir / f"slow-{n_rows}.npz"
    if not path.exists():
        rng = np.random.default_rng(19)
        X = rng.standard_normal((n_rows, CSV_FEATURES))
        np.savez(path, X=X, y=X[:, 0] - X[:, 1] + 0.1 * rng.standard_normal(n_rows))
    return path


def upload_slow(client: httpx.Client, path: Path) -> tuple[str, float]:
    """Store the slow dataset (an ``.npz`` body): its id and the seconds it took."""
    started = time.perf_counter()
    with path.open("rb") as body:
        response = client.post(
            "/datasets",
            content=body,
            headers={"content-type": "application/x-npz"},
            timeout=900,
        )
    response.raise_for_status()
    return response.json()["id"], time.perf_counter() - started


# --------------------------------------------------------------------------- the server


# --------------------------------------------------------------------------- the load


def two_lines(n_rows: int = 200, seed: int = 3) -> tuple[list[list[float]], list[float]]:
    """Rows from two noisy lines in three features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, 3))
    lines = np.array([[1.0, 2.0, -1.0], [-2.0, 0.5, 1.5]])
    labels = rng.integers(0, 2, size=n_rows)
    y = np.einsum("ij,ij->i", X, lines[labels]) + np.where(labels, 1.0, -1.0)
    y += 0.05 * rng.standard_normal(n_rows)
    return X.round(6).tolist(), y.round(6).tolist()


def small_fit(dataset_id: str, seed: int) -> dict[str, Any]:
    """A fit of a few milliseconds: classical AM, two restarts, on the stored 200 rows."""
    return {
        "dataset_id": dataset_id,
        "k": 2,
        "algorithm": "am-classic",
        "params": {"n_init": 2, "max_iter": 50},
        "seed": seed,
    }


class Load:
    """The clients of one run and what they saw."""

    def __init__(
        self, *, base_url: str, api_key: str, config: LoadConfig, dataset_id: str, model_id: str
    ) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.config = config
        self.dataset_id = dataset_id
        self.model_id = model_id
        self.tally = Tally()
        self._deadline = 0.0
        self.database_url = ""
        self.phase = ""
        self.big_files: tuple[Path, Path] | None = None
        self.slow_dataset_id = ""  # empty: fit the CSV's dataset
        self.big = BigBodies()

    def _done(self) -> bool:
        return time.monotonic() >= self._deadline or self.tally.requests >= self.config.max_requests

    async def _send(
        self,
        client: httpx.AsyncClient,
        operation: str,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        scheduled: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response | None:
        """One request, timed from ``scheduled`` (its slot in a paced client's schedule) or
        from now; None if the server could not be reached (it was killed).

        Timing from the slot counts the time a request waited because the one before it was
        slow, as a user who asked on time would see it. It counts in the phase it was sent
        in: on a slow server a request sent before the big bodies may be answered during
        them."""
        phase = self.phase
        started = time.perf_counter() if scheduled is None else scheduled
        try:
            response = await client.request(
                method, url, headers={**self.headers, **(headers or {})}, **kwargs
            )
        except httpx.TransportError:
            self.tally.unavailable[operation + phase] += 1
            await asyncio.sleep(0.05)
            return None
        self.tally.record(
            operation + phase,
            response.status_code,
            time.perf_counter() - started,
            response.text,
        )
        return response

    async def _submit_fit(
        self, client: httpx.AsyncClient, rng: random.Random, scheduled: float | None
    ) -> bool:
        """Submit a small fit; True if a 429 made the client wait."""
        # The same key on every retry: a submission that reached the server before a crash is
        # found again instead of being queued twice.
        key = uuid.uuid4().hex
        body = small_fit(self.dataset_id, rng.randrange(1_000_000))
        while not self._done():
            response = await self._send(
                client,
                "fit",
                "POST",
                "/fit",
                json=body,
                headers={"Idempotency-Key": key},
                scheduled=scheduled,
            )
            scheduled = None
            if response is None:
                self.tally.unanswered_fits[key] = body
                continue
            self.tally.unanswered_fits.pop(key, None)
            if response.status_code == 202:
                self.tally.accepted_jobs[key] = response.json()["job_id"]
            elif response.status_code == 429:
                wait = float(response.headers.get("Retry-After", "1"))
                await asyncio.sleep(min(wait, max(0.0, self._deadline - time.monotonic())))
                return True
            return False
        return False

    async def _client(self, index: int) -> None:
        rng = random.Random(self.config.seed * 1000 + index)
        row = [[rng.uniform(-1, 1) for _ in range(3)]]
        interval = 1 / self.config.rate if self.config.rate > 0 else 0.0
        # Clients start at random phases of their interval, not all at once.
        slot = time.perf_counter() + rng.uniform(0, interval)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=60) as client:
            while not self._done():
                scheduled = None
                if interval:
                    await asyncio.sleep(max(0.0, slot - time.perf_counter()))
                    scheduled, slot = slot, slot + interval
                draw = rng.random()
                if draw < FIT_SHARE:
                    if await self._submit_fit(client, rng, scheduled):
                        # The client waited as a 429 told it to: its schedule goes on from now.
                        slot = max(slot, time.perf_counter())
                elif draw < FIT_SHARE + JOB_SHARE and self.tally.accepted_jobs:
                    job_id = rng.choice(list(self.tally.accepted_jobs.values()))
                    await self._send(client, "job", "GET", f"/jobs/{job_id}", scheduled=scheduled)
                elif draw < FIT_SHARE + JOB_SHARE + LIST_SHARE:
                    listing = rng.choice(list(LIST_PATHS))
                    await self._send(
                        client, listing, "GET", LIST_PATHS[listing], scheduled=scheduled
                    )
                else:
                    await self._send(
                        client,
                        "predict",
                        "POST",
                        f"/models/{self.model_id}/predict",
                        json={"X": row},
                        scheduled=scheduled,
                    )

    async def run(self, server: ServerProcess) -> tuple[float, list[str]]:
        """Run the clients; return the wall time and the jobs running when the server was
        killed (if it was)."""
        warmup_s = self.config.warmup_s
        self._deadline = time.monotonic() + warmup_s + self.config.duration_s
        started = time.monotonic()
        self.phase = WARM_UP if warmup_s > 0 else ""
        clients = [asyncio.create_task(self._client(index)) for index in range(self.config.clients)]
        killed_running: list[str] = []
        if warmup_s > 0:
            await asyncio.sleep(warmup_s)
            self.phase = ""
        if self.config.big_bodies:
            await asyncio.sleep(self.config.duration_s)
            # The clients go on until the big bodies are done.
            self._deadline = float("inf")
            self.phase = DURING
            await asyncio.to_thread(self._send_big_bodies)
            self._deadline = 0.0
        if self.config.kill_at_s is not None:
            await asyncio.sleep(self.config.kill_at_s)
            killed_running = await asyncio.to_thread(self._kill_and_restart, server)
        await asyncio.gather(*clients)
        return time.monotonic() - started, killed_running

    def _send_big_bodies(self) -> None:
        """Upload the big CSV and the big JSON body at once, then fit the CSV's dataset."""
        assert self.big_files is not None
        csv_path, json_path = self.big_files
        big = self.big
        big.csv_bytes, big.json_bytes = csv_path.stat().st_size, json_path.stat().st_size
        dataset_ids: dict[str, str] = {}

        def upload(kind: str, path: Path, media_type: str, params: dict[str, str]) -> None:
            started = time.perf_counter()
            with (
                httpx.Client(base_url=self.base_url, headers=self.headers, timeout=600) as client,
                path.open("rb") as body,
            ):
                response = client.post(
                    "/datasets", content=body, params=params, headers={"content-type": media_type}
                )
            seconds = time.perf_counter() - started
            if kind == "csv":
                big.csv_upload_s = seconds
            else:
                big.json_upload_s = seconds
            if response.status_code != 201:
                big.errors.append(f"{kind} upload {response.status_code}: {response.text[:300]}")
            else:
                dataset_ids[kind] = response.json()["id"]

        uploads = [
            threading.Thread(target=upload, args=("csv", csv_path, "text/csv", {"target": "y"})),
            threading.Thread(target=upload, args=("json", json_path, "application/json", {})),
        ]
        for thread in uploads:
            thread.start()
        for thread in uploads:
            thread.join()
        if "csv" not in dataset_ids:
            return
        fitted_id = self.slow_dataset_id or dataset_ids["csv"]
        started = time.perf_counter()
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=60) as client:
            body = {
                "dataset_id": fitted_id,
                "k": 2,
                "algorithm": "am-classic",
                "params": {"n_init": 1, "max_iter": 3},
                # Its load is what counts here: the fit itself (and its score, EM over every
                # training row) works on a tenth of the rows.
                "holdout_fraction": 0.9,
            }
            response = client.post("/fit", json=body)
            # The clients may hold the key's whole quota of unfinished jobs: wait as they do.
            while response.status_code == 429 and time.perf_counter() - started < 300:
                time.sleep(float(response.headers.get("Retry-After", "1")))
                response = client.post("/fit", json=body)
            if response.status_code != 202:
                big.errors.append(f"big fit {response.status_code}: {response.text[:300]}")
                return
            job_id = response.json()["job_id"]
            # An accepted job like the clients' (the checks count it with theirs).
            self.tally.accepted_jobs[f"big-bodies-{job_id}"] = job_id
            job: dict[str, Any] = {}
            failures = 0
            while time.perf_counter() - started < 900:
                try:
                    job = client.get(f"/jobs/{job_id}").json()
                except httpx.TransportError as exc:
                    # A kept-alive connection the server just closed; a server gone for good
                    # fails every try.
                    failures += 1
                    if failures == 20:
                        big.errors.append(f"the server stopped answering: {exc!r}")
                        return
                    time.sleep(0.5)
                    continue
                failures = 0
                if job["status"] in TERMINAL:
                    break
                time.sleep(0.2)
        big.fit_s = time.perf_counter() - started
        big.fit_job = job
        big.fitted_rows = CSV_ROWS if fitted_id == dataset_ids["csv"] else self.config.slow_rows
        big.load_s = _dataset_load_seconds(self.database_url, fitted_id)

    def _kill_and_restart(self, server: ServerProcess) -> list[str]:
        server.kill()
        # Read after the kill, from the database itself: the jobs the crash interrupted.
        engine = create_engine(self.database_url, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                running = list(
                    connection.scalars(text("SELECT id FROM jobs WHERE status = 'running'"))
                )
        finally:
            engine.dispose()
        server.start()
        return running


def _dataset_load_seconds(database_url: str, dataset_id: str) -> float:
    """Seconds to read the stored rows of ``dataset_id`` as a fit process does (one read
    transaction, chunk by chunk)."""
    engine = make_engine(database_url)
    try:
        started = time.perf_counter()
        with read_scope(make_sessionmaker(engine)) as session:
            dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
            assert dataset is not None
            for _ in dataset_store.iter_dataset_blocks(session, dataset=dataset):
                pass
        return time.perf_counter() - started
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- before and after


def prepare(client: httpx.Client, *, timeout_s: float = 120) -> tuple[str, str, str]:
    """Upload the data set and fit the model the predicts use: (dataset, model, job) ids."""
    X, y = two_lines()
    response = client.post("/datasets", json={"X": X, "y": y, "name": "load"})
    response.raise_for_status()
    dataset_id: str = response.json()["id"]
    response = client.post("/fit", json=small_fit(dataset_id, 0))
    response.raise_for_status()
    job_id: str = response.json()["job_id"]
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] == "succeeded":
            return dataset_id, job["model_id"], job_id
        if job["status"] in TERMINAL or time.monotonic() > deadline:
            raise RuntimeError(f"the model for the predicts was not fitted: {job}")
        time.sleep(0.05)


def _all_items(client: httpx.Client, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        page = client.get(path, params={"limit": 500, "offset": len(items)})
        page.raise_for_status()
        batch = page.json()["items"]
        items += batch
        if len(batch) < 500:
            return items


def settle(client: httpx.Client, tally: Tally, *, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Send unanswered submissions again and wait (at most ``timeout_s``) until every accepted
    job is final; return the last state of each accepted job (missing: lost)."""
    for key, body in list(tally.unanswered_fits.items()):
        response = client.post("/fit", json=body, headers={"Idempotency-Key": key})
        if response.status_code == 202:
            tally.accepted_jobs[key] = response.json()["job_id"]
        tally.unanswered_fits.pop(key)
    states: dict[str, dict[str, Any]] = {}
    pending = set(tally.accepted_jobs.values())
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for job_id in sorted(pending):
            response = client.get(f"/jobs/{job_id}")
            if response.status_code == 404:
                pending.discard(job_id)
                continue
            states[job_id] = response.json()
            if states[job_id]["status"] in TERMINAL:
                pending.discard(job_id)
        if pending:
            time.sleep(0.2)
    return states


def check(
    *,
    backend: str,
    config: LoadConfig,
    client: httpx.Client,
    tally: Tally,
    wall_s: float,
    setup_job_id: str,
    killed_running: Sequence[str],
) -> Outcome:
    """Settle the jobs and compare the database with what the clients were told."""
    states = settle(client, tally, timeout_s=config.drain_timeout_s)
    accepted = set(tally.accepted_jobs.values())
    jobs = {job["id"]: job for job in _all_items(client, "/jobs") if job["id"] != setup_job_id}
    models_per_job = Counter(model["job_id"] for model in _all_items(client, "/models"))
    wrong_models = [
        job_id
        for job_id, job in jobs.items()
        if models_per_job[job_id] != (1 if job["status"] == "succeeded" else 0)
    ]
    not_retried_once = [
        job_id
        for job_id in killed_running
        if states.get(job_id, jobs.get(job_id, {})).get("attempts") != 2
        or jobs.get(job_id, {}).get("status") != "succeeded"
    ]
    return Outcome(
        backend=backend,
        config=config,
        tally=tally,
        wall_s=wall_s,
        jobs_accepted=len(accepted),
        jobs_in_database=len(jobs),
        jobs_by_status=Counter(job["status"] for job in jobs.values()),
        lost_jobs=sorted(accepted - jobs.keys()),
        duplicated_jobs=sorted(jobs.keys() - accepted),
        unfinished_jobs=sorted(j for j, job in jobs.items() if job["status"] not in TERMINAL),
        models_per_job_wrong=wrong_models,
        killed_running_jobs=list(killed_running),
        not_retried_once=not_retried_once,
        requeued_jobs=(
            []
            if killed_running
            else sorted(j for j, job in jobs.items() if job.get("attempts", 1) > 1)
        ),
    )


# --------------------------------------------------------------------------- one backend


def run_backend(
    backend: str, database_url: str, config: LoadConfig, workdir: Path, *, log: bool = True
) -> Outcome:
    """Start a server on ``database_url`` with a write key, load it, check it, stop it."""
    key_file = workdir / f"{backend}-keys.json"
    made = new_key(scope="write", name="load")
    add_key(key_file, made.record)
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("MIXREG_") or name == "MIXREG_TEST_POSTGRES_URL"
    }
    environment.update(
        SERVER_SETTINGS,
        MIXREG_DATABASE_URL=database_url,
        MIXREG_API_KEYS_FILE=str(key_file),
        MIXREG_MAX_QUEUED_JOBS_PER_KEY=str(config.max_queued_jobs),
    )
    if config.big_bodies:
        environment["MIXREG_STALE_AFTER_S"] = BIG_BODIES_STALE_AFTER_S
    server = ServerProcess(
        UVICORN_APP,
        env=environment,
        log_path=workdir / f"{backend}-server.log",
    )
    server.start()
    try:
        headers = {"Authorization": f"Bearer {made.key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            dataset_id, model_id, setup_job_id = prepare(client)
            load = Load(
                base_url=server.url,
                api_key=made.key,
                config=config,
                dataset_id=dataset_id,
                model_id=model_id,
            )
            load.database_url = database_url
            if config.big_bodies:
                load.big_files = big_files(workdir)
                if backend.lower() == "sqlite":
                    load.slow_dataset_id, load.big.slow_upload_s = upload_slow(
                        client, slow_file(workdir, config.slow_rows)
                    )
            if log:
                print(
                    f"# {backend}: {config.clients} clients for {config.duration_s:g} s",
                    file=sys.stderr,
                )
            wall_s, killed_running = asyncio.run(load.run(server))
            outcome = check(
                backend=backend,
                config=config,
                client=client,
                tally=load.tally,
                wall_s=wall_s,
                setup_job_id=setup_job_id,
                killed_running=killed_running,
            )
            if config.big_bodies:
                outcome.big = load.big
            return outcome
    finally:
        server.stop()


@contextlib.contextmanager
def fresh_postgres_database(server_url: str, name: str = "mixreg_load") -> Iterator[str]:
    """A new, empty database ``name`` on the server of ``server_url``; dropped afterwards."""
    admin = create_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --------------------------------------------------------------------------- report


def _percentile_ms(values: Sequence[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.1f}" if values else "—"


def outcome_lines(outcome: Outcome) -> list[str]:
    """The Markdown of one backend's run."""
    tally = outcome.tally
    lines = [
        f"### {outcome.backend}",
        "",
        "| operation | requests | p50 ms | p99 ms | 2xx | 429 | other 4xx | 5xx | unreachable |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    operations = [*OPERATIONS, *(op + DURING for op in OPERATIONS if op + DURING in tally.statuses)]
    for operation in operations:
        statuses = tally.statuses[operation]
        count = sum(statuses.values())
        ok = sum(n for status, n in statuses.items() if status < 400)
        too_many = statuses[429]
        other_4xx = sum(n for s, n in statuses.items() if 400 <= s < 500 and s != 429)
        errors = sum(n for status, n in statuses.items() if status >= 500)
        latencies = tally.latencies[operation]
        lines.append(
            f"| {operation} | {count} | {_percentile_ms(latencies, 50)} | "
            f"{_percentile_ms(latencies, 99)} | {ok} | {too_many} | {other_4xx} | {errors} | "
            f"{tally.unavailable[operation]} |"
        )
    by_status = ", ".join(f"{n} {status}" for status, n in sorted(outcome.jobs_by_status.items()))
    kill = (
        f"; killed (SIGKILL) after {outcome.config.kill_at_s:g} s with "
        f"{len(outcome.killed_running_jobs)} fits running, each retried once: "
        f"{'yes' if not outcome.not_retried_once else 'no'}"
        if outcome.config.kill_at_s is not None
        else ""
    )
    lines += [
        "",
        f"{tally.requests} requests in {outcome.wall_s:.1f} s "
        f"({tally.requests / outcome.wall_s:.0f} per second){kill}. Jobs: "
        f"{outcome.jobs_accepted} accepted, {outcome.jobs_in_database} in the database "
        f"({by_status or 'none'}); lost {len(outcome.lost_jobs)}, duplicated "
        f"{len(outcome.duplicated_jobs)}, not final {len(outcome.unfinished_jobs)}, succeeded "
        f"without exactly one model {len(outcome.models_per_job_wrong)}; 5xx "
        f"{len(tally.server_errors)}; requeued {len(outcome.requeued_jobs)}.",
        "",
    ]
    if outcome.big is not None:
        lines += big_body_lines(outcome)
    return lines


def _p99(values: Sequence[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def big_body_lines(outcome: Outcome) -> list[str]:
    """What the big bodies did, and the p99 during them against before."""
    big = outcome.big
    assert big is not None
    latencies = outcome.tally.latencies
    job = big.fit_job
    fitted = (
        f"a {big.fitted_rows:,} x {CSV_FEATURES} dataset stored as an `.npz` body in "
        f"{big.slow_upload_s:.1f} s before the clients started"
        if big.slow_upload_s
        else "the CSV's dataset"
    )
    lines = [
        f"Big bodies: the {CSV_ROWS:,} x {CSV_FEATURES} CSV ({big.csv_bytes / 2**20:.0f} MiB) was "
        f"stored in {big.csv_upload_s:.1f} s and the JSON body ({big.json_bytes / 2**20:.1f} "
        f"MiB) in {big.json_upload_s:.1f} s, both at once; then a fit of {fitted} (reading it "
        f"back takes {big.load_s:.1f} s, `MIXREG_STALE_AFTER_S` = "
        f"{BIG_BODIES_STALE_AFTER_S}) ended {job.get('status')} after {job.get('attempts')} "
        f"attempt(s) in {big.fit_s:.1f} s. Errors: {len(big.errors)}.",
        "",
        "| p99 ms | before | during big bodies | ratio |",
        "|---|---|---|---|",
    ]
    for operation in ("predict", "list jobs", "job"):
        before, during = _p99(latencies[operation]), _p99(latencies[operation + DURING])
        lines.append(
            f"| {operation} | {before * 1000:.1f} | {during * 1000:.1f} | {during / before:.1f} |"
        )
    lines += ["", "| target | goal | measured | met |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {goal} | {measured} | {'yes' if met else '**no**'} |"
        for name, goal, measured, met in big_body_targets(outcome)
    ]
    return [*lines, ""]


def big_body_targets(outcome: Outcome) -> list[tuple[str, str, str, bool]]:
    """What a run with big bodies must show: (name, goal, measured, met)."""
    big = outcome.big
    assert big is not None
    latencies = outcome.tally.latencies
    jobs_before = _p99(latencies["list jobs"])
    targets = [
        (
            "`GET /jobs` p99 without big bodies",
            f"< {JOBS_P99_TARGET_S * 1000:.0f} ms",
            f"{jobs_before * 1000:.1f} ms",
            jobs_before < JOBS_P99_TARGET_S,
        )
    ]
    for operation, name in (("list jobs", "`GET /jobs`"), ("predict", "single-row predict")):
        before, during = _p99(latencies[operation]), _p99(latencies[operation + DURING])
        targets.append(
            (
                f"{name} p99 during big bodies",
                f"at most {DURING_RATIO_TARGET:g} times before",
                f"{during / before:.2f} times",
                during <= DURING_RATIO_TARGET * before,
            )
        )
    stale_after_s = float(BIG_BODIES_STALE_AFTER_S)
    problems = len(outcome.tally.server_errors) + len(big.problems)
    lost = len(outcome.lost_jobs) + len(outcome.unfinished_jobs)
    targets += [
        (
            "the big dataset loads for longer than `MIXREG_STALE_AFTER_S`",
            f"> {stale_after_s:g} s",
            f"{big.load_s:.1f} s",
            big.load_s > stale_after_s,
        ),
        ("errors (5xx, failed big requests)", "0", str(problems), problems == 0),
        ("requeued jobs", "0", str(len(outcome.requeued_jobs)), not outcome.requeued_jobs),
        ("jobs lost or not final", "0", str(lost), lost == 0),
    ]
    return targets


def pacing(config: LoadConfig) -> str:
    """How the clients send, in words."""
    if config.rate <= 0:
        return "each sending its next request as soon as the last is answered (saturation)"
    return (
        f"each sending {config.rate:g} requests per second on a fixed schedule "
        f"({config.rate * config.clients:g} per second offered; a request's latency counts from "
        f"its slot in the schedule, so time spent waiting for a slow answer before it counts)"
    )


def section(outcomes: Sequence[Outcome], machine: Sequence[str]) -> str:
    """The load section of ``bench/RESULTS.md``."""
    config = outcomes[0].config
    lines = [
        "## Load on loopback (`bench/load.py`)",
        "",
        *machine,
        "",
        f"{config.clients} concurrent clients (asyncio, one process) for {config.duration_s:g} s, "
        f"{pacing(config)}, against one server (uvicorn, embedded worker with 2 fit processes) "
        f"with API keys required, after {config.warmup_s:g} s of warm-up (checked for errors, "
        f"not timed); each client draws single-row predicts ({PREDICT_SHARE:.0%}), "
        f"listings of jobs, models or datasets ({LIST_SHARE:.0%}), job lookups ({JOB_SHARE:.0%}) "
        f"and small fits ({FIT_SHARE:.0%}, classical AM on 200 rows; at most "
        f"{config.max_queued_jobs} unfinished per key, then 429 and Retry-After). Latencies are "
        f"of answered requests below 400, measured by the clients on the same 2 cores as the "
        f"server.",
        "",
    ]
    for outcome in outcomes:
        lines += outcome_lines(outcome)
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load on each backend, print the tables, optionally record them."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (60)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (32)")
    parser.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"requests per second per client, on a schedule ({DEFAULT_RATE:g}); 0: back to back",
    )
    parser.add_argument(
        "--warmup", type=float, default=WARMUP_S, help=f"seconds not timed first ({WARMUP_S:g})"
    )
    parser.add_argument(
        "--slow-rows",
        type=int,
        default=SLOW_ROWS,
        help=f"rows of the dataset fitted during the big bodies on SQLite ({SLOW_ROWS:,})",
    )
    parser.add_argument("--max-requests", type=int, default=500_000, help="at most (500,000)")
    parser.add_argument("--kill-at", type=float, help="SIGKILL the server after this many s")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("MIXREG_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where the database mixreg_load is created and dropped",
    )
    parser.add_argument(
        "--big-bodies",
        action="store_true",
        help="after --duration s, send a 1,000,000 x 20 CSV, a 64 MiB JSON body and fit the CSV",
    )
    parser.add_argument("--write", action="store_true", help="record in bench/RESULTS.md")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    config = LoadConfig(
        duration_s=args.duration,
        clients=args.clients,
        max_requests=args.max_requests,
        kill_at_s=args.kill_at,
        big_bodies=args.big_bodies,
        rate=args.rate,
        slow_rows=args.slow_rows,
        warmup_s=args.warmup,
    )
    machine = machine_lines("python -m bench.load " + " ".join(argv or sys.argv[1:]), ("httpx",))
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="mixreg-load-") as directory:
        workdir = Path(directory)
        for backend in args.backends.split(","):
            if backend == "sqlite":
                url = f"sqlite:///{workdir / 'load.db'}"
                outcomes.append(run_backend("SQLite", url, config, workdir))
            elif backend == "postgresql":
                with fresh_postgres_database(args.postgres_url) as url:
                    outcomes.append(run_backend("PostgreSQL", url, config, workdir))
            else:
                parser.error(f"unknown backend {backend!r}; use sqlite and/or postgresql")
    report = section(outcomes, machine)
    print(report)
    if args.write:
        write_section(args.output, SECTION, report)
    problems = [f"{o.backend}: {problem}" for o in outcomes for problem in o.problems]
    for problem in problems:
        print(f"# FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
