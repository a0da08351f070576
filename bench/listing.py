"""What a page of ``GET /jobs`` costs in the database, as the jobs table grows.

For each backend a fresh database gets ``--jobs`` jobs; then, in read transactions as a
request makes them, the page a listing reads (``models_store.jobs.list_jobs``: the newest 21
jobs and the total count) is timed, its count alone too, and the page again once the
``(created_at, id)`` index of revision 0013 is dropped (the database is thrown away after).
Milliseconds per call are medians of ``--repeat`` calls. ``--write`` records the table in
``bench/RESULTS.md`` between ``<!-- listing:start -->`` and ``<!-- listing:end -->``. Run with
``python -m bench.listing [--jobs 20000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from sqlalchemy import func, select

from bench.load import DEFAULT_POSTGRES_URL, fresh_postgres_database
from bench.sections import load_average, log, machine_lines, write_section
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.migrate import upgrade
from models_store.session import make_engine, make_sessionmaker, read_scope, session_scope
from models_store.tables import Job

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "listing"
PAGE = 21  # GET /jobs?limit=20 reads one row more, to know whether a next page exists


def median_ms(call: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of ``call`` over ``repeat`` calls (after one to warm up)."""
    call()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000


def measure(database_url: str, n_jobs: int, repeat: int) -> list[str]:
    """The row of one backend: page and count with the index, page without it."""
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        factory = make_sessionmaker(engine)
        with session_scope(factory) as session:
            dataset = dataset_store.create_dataset(
                session,
                X=np.ones((10, 3)),
                y=np.ones(10),
                feature_names=None,
                target_name=None,
                name=None,
            )
            for seed in range(n_jobs):
                job_store.create_job(
                    session,
                    job_store.JobRecord(
                        dataset_id=dataset.id,
                        algorithm="am-classic",
                        n_components=2,
                        params={"n_init": 2, "max_iter": 50},
                        fit_intercept=True,
                        holdout_fraction=0.2,
                        seed=seed,
                        max_attempts=3,
                    ),
                )

        def page() -> object:
            with read_scope(factory) as session:
                return job_store.list_jobs(session, status=None, limit=PAGE, offset=0)

        def count() -> object:
            with read_scope(factory) as session:
                return session.scalar(select(func.count()).select_from(Job))

        indexed, counted = median_ms(page, repeat), median_ms(count, repeat)
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP INDEX ix_jobs_created_at_id")
        unindexed = median_ms(page, repeat)
    finally:
        engine.dispose()
    return [f"{indexed:.1f}", f"{counted:.1f}", f"{unindexed:.1f}", f"{unindexed / indexed:.0f}"]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure on each backend, print the table, optionally record it."""
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in the table (20,000)")
    parser.add_argument("--repeat", type=int, default=30, help="calls timed per figure (30)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("MIXREG_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="a PostgreSQL server where a scratch database is created and dropped",
    )
    parser.add_argument("--write", action="store_true", help="record in bench/RESULTS.md")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    machine = machine_lines("python -m bench.listing " + " ".join(argv or sys.argv[1:]), ())
    rows = []
    with tempfile.TemporaryDirectory(prefix="mixreg-listing-") as directory:
        for backend in args.backends.split(","):
            log(f"{backend}: {args.jobs:,} jobs")
            if backend == "sqlite":
                url = f"sqlite:///{Path(directory) / 'listing.db'}"
                rows.append(["SQLite", *measure(url, args.jobs, args.repeat)])
            elif backend == "postgresql":
                with fresh_postgres_database(args.postgres_url, "mixreg_listing") as url:
                    rows.append(["PostgreSQL", *measure(url, args.jobs, args.repeat)])
            else:
                parser.error(f"unknown backend {backend!r}; use sqlite and/or postgresql")
    lines = [
        "## The cost of a page of `GET /jobs` (`bench/listing.py`)",
        "",
        *machine,
        f"- Load average (1, 5, 15 min) at the end: {load_average()}",
        "",
        f"{args.jobs:,} jobs in the table; milliseconds per call (median of {args.repeat}) of "
        f"the read transaction a `GET /jobs?limit=20` makes: its page (the newest {PAGE} "
        f"jobs and the total count), the count alone, and the page without the "
        f"`(created_at, id)` index of revision 0013 (a scan and sort of the whole table).",
        "",
        "| backend | page ms | count ms | page ms without the index | ratio |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.write:
        write_section(args.output, SECTION, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
