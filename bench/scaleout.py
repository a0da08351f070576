"""Scale-out benchmark: fits per minute with the embedded worker, and with one and with two
``mixreg worker`` processes on Procrastinate, on the same PostgreSQL database and workload.

Each configuration starts from an empty database (``mixreg db upgrade``), runs the real
commands (``mixreg serve``, ``mixreg worker``) as a user does, uploads one data set, submits
all the fits at once (the same requests, seeds 0..n-1) and measures the wall time from the
first submission until the last job has finished; fits per minute = fits / that time. Every
worker process (the API's embedded worker, or each ``mixreg worker``) runs as many fits at once
as the machine has usable cores, so on one machine a second ``mixreg worker`` adds processes,
not cores: what it shows here is the overhead of the queue, and on a second machine it would
add that machine's cores.

PostgreSQL is named by ``MIXREG_BENCH_POSTGRES_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``, a maintenance database); the
benchmark creates and finally drops its own database ``mixreg_bench_scaleout`` there. Without a
reachable server it prints why and exits without writing.

``python -m bench.scaleout`` writes its section of ``bench/RESULTS.md`` between the lines
``<!-- scaleout:start -->`` and ``<!-- scaleout:end -->`` (appended if missing); ``--quick``
runs a smaller workload and writes only with ``--output``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
from sqlalchemy import make_url

from bench.sections import log, machine_lines, write_section
from bench.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "scaleout"
MIXREG = str(Path(sys.executable).parent / "mixreg")
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DATABASE_NAME = "mixreg_bench_scaleout"
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Settings:
    """Size of one run: ``n_fits`` fits of ``k`` lines on ``n_rows`` x ``n_features`` rows."""

    n_fits: int
    n_rows: int
    n_features: int
    k: int


FULL = Settings(n_fits=40, n_rows=5000, n_features=5, k=3)
QUICK = Settings(n_fits=8, n_rows=400, n_features=3, k=2)


@dataclass(frozen=True)
class Configuration:
    name: str
    worker: str
    """``embedded`` or ``procrastinate``."""
    n_workers: int
    """``mixreg worker`` processes (0 with the embedded worker)."""


CONFIGURATIONS = (
    Configuration("embedded worker (in the API process)", "embedded", 0),
    Configuration("Procrastinate, 1 `mixreg worker`", "procrastinate", 1),
    Configuration("Procrastinate, 2 `mixreg worker`", "procrastinate", 2),
)


@dataclass(frozen=True)
class Outcome:
    configuration: Configuration
    fits_at_once: int
    n_fits: int
    succeeded: int
    wall_seconds: float
    mean_fit_seconds: float
    per_worker: list[int]

    @property
    def fits_per_minute(self) -> float:
        return self.n_fits / (self.wall_seconds / 60)


class Process:
    """A ``mixreg`` command in the background, its output in a log file."""

    def __init__(self, args: list[str], *, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [MIXREG, *args], env=env, stdout=log_file, stderr=subprocess.STDOUT
            )

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.process.args} exited early:\n{tail}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def unreachable(server_url: str) -> str | None:
    """Why PostgreSQL at ``server_url`` cannot be used, or None if it can."""
    conninfo = make_url(server_url).set(drivername="postgresql").render_as_string(False)
    try:
        with psycopg.connect(conninfo, connect_timeout=5):
            return None
    except psycopg.OperationalError as exc:
        where = make_url(server_url).render_as_string(hide_password=True)
        return f"PostgreSQL is not reachable at {where} ({exc})"


@contextlib.contextmanager
def bench_database(server_url: str, name: str = DATABASE_NAME) -> Iterator[str]:
    """Create the benchmark's database ``name`` on the server of ``server_url``; drop it at
    the end."""
    admin = make_url(server_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {name}")
    try:
        yield make_url(server_url).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def reset_schema(database_url: str) -> None:
    conninfo = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")


def make_data(settings: Settings, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Rows from ``k`` noisy lines."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((settings.n_rows, settings.n_features))
    lines = rng.standard_normal((settings.k, settings.n_features + 1)) * 3
    labels = rng.integers(0, settings.k, size=settings.n_rows)
    y = np.einsum("ij,ij->i", X, lines[labels, :-1]) + lines[labels, -1]
    return X, y + 0.1 * rng.standard_normal(settings.n_rows)


def wait_until(condition: Any, *, timeout: float, what: str, processes: Sequence[Process]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            process.check_alive()
        with contextlib.suppress(httpx.TransportError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def run_configuration(
    configuration: Configuration, settings: Settings, database_url: str, folder: Path
) -> Outcome:
    log(f"{configuration.name}: {settings.n_fits} fits")
    reset_schema(database_url)
    concurrency = len(os.sched_getaffinity(0))
    env = {
        **os.environ,
        "MIXREG_DATABASE_URL": database_url,
        "MIXREG_WORKER": configuration.worker,
        "MIXREG_WORKER_CONCURRENCY": str(concurrency),
    }
    subprocess.run([MIXREG, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    processes = [
        Process(
            ["serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            env=env,
            log_path=folder / f"{configuration.worker}-api.log",
        )
    ]
    processes += [
        Process(
            ["worker", "--concurrency", str(concurrency)],
            env=env,
            log_path=folder / f"{configuration.worker}-worker-{index}.log",
        )
        for index in range(configuration.n_workers)
    ]
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:

        def ready() -> bool:
            response = client.get("/readyz")
            if response.status_code != 200:
                return False
            queue = response.json().get("queue")
            return queue is None or queue["workers"] == configuration.n_workers

        wait_until(ready, timeout=180, what="the service is ready", processes=processes)
        X, y = make_data(settings)
        dataset = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist()})
        dataset.raise_for_status()
        dataset_id = dataset.json()["id"]
        # One fit first, untimed: every worker process has started its fork server and
        # imported the fit code before the clock starts.
        warm_up = client.post("/fit", json={"dataset_id": dataset_id, "k": settings.k})
        warm_up.raise_for_status()
        warm_up_id = warm_up.json()["job_id"]
        wait_until(
            lambda: client.get(f"/jobs/{warm_up_id}").json()["status"] in TERMINAL,
            timeout=600,
            what="the warm-up fit finished",
            processes=processes,
        )
        started = time.perf_counter()
        job_ids = []
        for seed in range(settings.n_fits):
            response = client.post(
                "/fit", json={"dataset_id": dataset_id, "k": settings.k, "seed": seed}
            )
            response.raise_for_status()
            job_ids.append(response.json()["job_id"])
        jobs: list[dict[str, Any]] = []

        def finished() -> bool:
            nonlocal jobs
            page = client.get("/jobs", params={"limit": 500}).json()["items"]
            jobs = [job for job in page if job["id"] in set(job_ids)]
            return len(jobs) == len(job_ids) and all(job["status"] in TERMINAL for job in jobs)

        wait_until(finished, timeout=3600, what="every fit finished", processes=processes)
        wall = time.perf_counter() - started
        fit_seconds = []
        for job in jobs:
            if job["model_url"]:
                fit_seconds.append(client.get(job["model_url"]).json()["fit_seconds"])
        per_worker = Counter(job["worker_id"] for job in jobs)
    finally:
        client.close()
        for process in processes:
            process.stop()
    return Outcome(
        configuration=configuration,
        fits_at_once=concurrency * max(configuration.n_workers, 1),
        n_fits=len(job_ids),
        succeeded=sum(job["status"] == "succeeded" for job in jobs),
        wall_seconds=wall,
        mean_fit_seconds=statistics.fmean(fit_seconds) if fit_seconds else float("nan"),
        per_worker=sorted(per_worker.values(), reverse=True),
    )


def section(
    outcomes: Sequence[Outcome], settings: Settings, machine: Sequence[str], *, quick: bool
) -> str:
    lines = ["## Scale-out: embedded worker and Procrastinate workers (issue 7)", ""]
    if quick:
        lines += ["**Quick smoke run: a small workload.**", ""]
    lines += ["Machine and run:", "", *machine, ""]
    lines += [
        f"Workload: {settings.n_fits} fits submitted at once, each `auto` with k = {settings.k} "
        f"on one stored data set of {settings.n_rows:,} rows x {settings.n_features} features "
        "(seeds 0..n-1), on PostgreSQL, after one untimed warm-up fit. Wall time: from the "
        "first submission until the last job finished. Each worker process runs as many "
        "fits at once as this machine has usable cores; the second `mixreg worker` runs on "
        "the same machine, so it adds processes, not cores.",
        "",
        "| configuration | fits at once | fits (succeeded) | wall time (s) | fits per minute "
        "| mean fit time (s) | fits per worker process |",
        "|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        lines.append(
            f"| {outcome.configuration.name} | {outcome.fits_at_once} | {outcome.n_fits} "
            f"({outcome.succeeded}) | {outcome.wall_seconds:.1f} | "
            f"{outcome.fits_per_minute:.1f} | {outcome.mean_fit_seconds:.2f} | "
            f"{', '.join(str(count) for count in outcome.per_worker)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaleout",
        description="Fits per minute with the embedded worker and with 1 and 2 Procrastinate "
        "workers; write the scale-out section of bench/RESULTS.md.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK.n_fits} fits on {QUICK.n_rows} rows",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="Markdown file whose scale-out section is written (default: bench/RESULTS.md for "
        "a full run; a quick run writes only when this is given)",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    output = args.output if args.output or args.quick else DEFAULT_OUTPUT
    command = " ".join(["python -m bench.scaleout", *(sys.argv[1:] if argv is None else argv)])
    server_url = os.environ.get("MIXREG_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    problem = unreachable(server_url)
    if problem is not None:
        print(f"scale-out benchmark skipped: {problem}")
        return
    machine = machine_lines(command)
    with (
        bench_database(server_url) as database_url,
        tempfile.TemporaryDirectory(prefix="mixreg-bench-scaleout-") as name,
    ):
        outcomes = [
            run_configuration(configuration, settings, database_url, Path(name))
            for configuration in CONFIGURATIONS
        ]
    text = section(outcomes, settings, machine, quick=args.quick)
    print(text)
    if output is not None:
        write_section(output, SECTION, text)
        log(f"wrote the scale-out section of {output}")


if __name__ == "__main__":
    main()
