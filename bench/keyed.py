"""Keyed fits: a mixture per shared account, for many accounts at once.

Generated shared accounts (``mixreg.datasets.make_shared_accounts``: 2 to 3 people of
distinct tastes per account, d = 4) are fitted with k = 2 by ``mixreg.fit_per_key`` (the
keyed job's estimator, batched across keys) and, on a sample of the same accounts, by a loop
of the default estimator (``MixtureOfLinearRegressions``, ``auto``) one account at a time;
the loop's time is extrapolated to every account. Each sampled account's min-loss is compared
(ratio of the keyed fit's to the default's). The keyed single-row predict (the serving path's
lookup of the row's key among 10^6 loaded keys, then its lines) is timed beside the plain
single-row predict of one model. Peak memory (max RSS) of the fitting process is reported.
The same accounts are then fitted as one keyed job through the service on PostgreSQL with 1
and with 2 Procrastinate workers (``bench.keyed_workers``), with the peak memory of the API
and of each worker's processes.

``python -m bench.keyed`` writes the section ``keyed`` of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.keyed_workers import WorkersOutcome
from bench.keyed_workers import measure as measure_workers
from bench.sections import Report, load_average, log, machine_lines, write_section
from mixreg import MixtureOfLinearRegressions, fit_per_key, min_loss
from mixreg.datasets import make_shared_accounts
from service.config import DEFAULT_KEYED_GLOBAL_ROWS
from service.serving.prediction import StoredLines, keyed_lines, positions_of, predict_rows

SECTION = "keyed"
MEMORY_SECTION = "keyed-memory"
FULL_ACCOUNTS = 100_000
QUARTERS = 4
DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")


def _default_loop(
    X: np.ndarray, y: np.ndarray, account: np.ndarray, sample: np.ndarray
) -> tuple[float, np.ndarray]:
    """Seconds per account of the default estimator fitted on each sampled account alone, and
    each one's min-loss."""
    order = np.argsort(account, kind="stable")
    bounds = np.searchsorted(account[order], [sample, sample + 1])
    losses = []
    started = time.perf_counter()
    for position, key in enumerate(sample):
        rows = order[bounds[0][position] : bounds[1][position]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = MixtureOfLinearRegressions(n_components=2, random_state=int(key)).fit(
                X[rows], y[rows]
            )
        losses.append(min_loss(y[rows], fitted.predict(X[rows])))
    return (time.perf_counter() - started) / len(sample), np.array(losses)


def _predict_seconds(n_keys: int, rounds: int) -> tuple[float, float]:
    """Median seconds of one single-row keyed predict among ``n_keys`` keys, and of one plain
    single-row predict, by the serving code (after the body is parsed)."""
    rng = np.random.default_rng(0)
    k, d = 2, 4
    keys = np.array([f"account-{i:07d}" for i in range(n_keys)])
    keyed = keyed_lines(
        {
            "keys": np.sort(keys),
            "coef": rng.standard_normal((n_keys, k, d)),
            "intercept": rng.standard_normal((n_keys, k)),
            "shares": np.full((n_keys, k), 0.5),
            "min_loss": np.ones(n_keys),
            "n_rows": np.full(n_keys, 200),
            "status": np.zeros(n_keys, dtype=np.int8),
        }
    )
    plain = StoredLines(model_id="plain", coef=rng.standard_normal((k, d)), intercept=np.zeros(k))
    with_keys = StoredLines(
        model_id="keyed",
        coef=plain.coef,
        intercept=plain.intercept,
        split_by="a",
        keyed=keyed,
        key_positions=positions_of(keyed),
    )
    row = rng.standard_normal((1, d))
    asked = [[str(keys[i])] for i in rng.integers(0, n_keys, size=rounds)]
    timings: dict[str, list[float]] = {"plain": [], "keyed": []}
    for index in range(rounds):
        started = time.perf_counter()
        predict_rows(plain, row, None)
        timings["plain"].append(time.perf_counter() - started)
        started = time.perf_counter()
        predict_rows(with_keys, row, asked[index])
        timings["keyed"].append(time.perf_counter() - started)
    return statistics.median(timings["keyed"]), statistics.median(timings["plain"])


def _endpoint_seconds(n_keys: int, rounds: int, folder: Path) -> tuple[float, float]:
    """Median seconds of one single-row ``POST /models/{id}/predict`` through the whole app (in
    process: routing, body parsing, lookup, serialization; no network), for a keyed model of
    ``n_keys`` keys stored in its chunks and for a plain model, alternating."""
    from fastapi.testclient import TestClient

    from models_store import datasets as dataset_store
    from models_store import jobs as job_store
    from models_store import migrate
    from models_store import models as model_store
    from models_store import shards as shard_store
    from models_store.common import utcnow
    from models_store.session import make_engine, make_sessionmaker, session_scope
    from service.config import Settings
    from service.main import create_app

    url = f"sqlite:///{folder / 'keyed.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    rng = np.random.default_rng(0)
    k, d = 2, 4
    lines = {
        "coef": [[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]],
        "intercept": [0.0, 1.0],
        "shares": [0.5, 0.5],
    }
    scores = {
        "train_min_loss": 1.0,
        "holdout_min_loss": None,
        "baseline": {"coef": [0.0] * d, "intercept": 0.0, "train_min_loss": 2.0},
        "n_train": 10,
        "n_holdout": 0,
        "loss_history": [1.0],
        "n_iter": 1,
        "fit_seconds": 0.0,
    }
    keys = np.array([f"account-{i:07d}" for i in range(n_keys)])
    with session_scope(make_sessionmaker(engine)) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.zeros((10, d)),
            y=np.zeros(10),
            feature_names=None,
            target_name=None,
            name=None,
        )
        common = {
            "job_id": None,
            "dataset_id": dataset.id,
            "name": None,
            "algorithm": "auto",
            "n_components": k,
            "n_features": d,
            "feature_names": [f"x{j}" for j in range(d)],
            "fit_intercept": True,
            "params": {},
            "seed": 0,
            **lines,
            **scores,
        }
        plain_id = model_store.create_model(session, model_store.ModelRecord(**common)).id
        keyed_id = model_store.create_model(
            session, model_store.ModelRecord(**common, split_by="account")
        ).id
        job = job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="auto",
                n_components=k,
                params={},
                fit_intercept=True,
                holdout_fraction=0.0,
                max_attempts=1,
                split_by="account",
            ),
        )
        job_store.claim_job(session, job_id=job.id, worker_id="bench", now=utcnow())
        shard = 65_536
        starts = range(0, n_keys, shard)
        # The shards' rows are not read here: the keys' lines are made up.
        shard_store.plan_job_shards(
            session,
            job_id=job.id,
            shards=[(min(shard, n_keys - start), np.zeros(0, dtype=np.int64)) for start in starts],
        )
        for position, start in enumerate(starts):
            count = min(shard, n_keys - start)
            now = utcnow()
            shard_store.claim_job_shard(
                session, job_id=job.id, claimant="bench", now=now, stale_before=now
            )
            shard_store.store_job_shard(
                session,
                job_id=job.id,
                position=position,
                claimant="bench",
                worker_id="bench",
                arrays={
                    "keys": keys[start : start + count],
                    "coef": rng.standard_normal((count, k, d)),
                    "intercept": rng.standard_normal((count, k)),
                    "shares": np.full((count, k), 0.5),
                    "min_loss": np.ones(count),
                    "n_rows": np.full(count, 200),
                    "status": np.zeros(count, dtype=np.int8),
                },
            )
        shard_store.publish_job_shards(session, job_id=job.id, model_id=keyed_id)
    engine.dispose()
    row = rng.standard_normal(d).tolist()
    asked = keys[rng.integers(0, n_keys, size=rounds)].tolist()
    timings: dict[str, list[float]] = {"plain": [], "keyed": []}
    settings = Settings(database_url=url, embedded_worker=False)
    # The client logs every request at INFO: thousands of lines, and time, that are not the app's.
    logging.disable(logging.INFO)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        # The first request of each model loads it into the cache.
        client.post(f"/models/{plain_id}/predict", json={"X": [row]})
        client.post(f"/models/{keyed_id}/predict", json={"X": [row], "keys": [asked[0]]})
        for key in asked:
            started = time.perf_counter()
            answer = client.post(f"/models/{plain_id}/predict", json={"X": [row]})
            timings["plain"].append(time.perf_counter() - started)
            started = time.perf_counter()
            keyed = client.post(f"/models/{keyed_id}/predict", json={"X": [row], "keys": [key]})
            timings["keyed"].append(time.perf_counter() - started)
            assert answer.status_code == keyed.status_code == 200, keyed.text
    logging.disable(logging.NOTSET)
    return statistics.median(timings["keyed"]), statistics.median(timings["plain"])


def _workers_report(
    report: Report,
    workers: WorkersOutcome | str,
    n_accounts: int,
    n_ratings: int,
    global_rows: int = DEFAULT_KEYED_GLOBAL_ROWS,
) -> None:
    """The keyed job's times with 1 and 2 workers and the processes' peak memory."""
    if isinstance(workers, str):
        report.add(f"The keyed job through the service was not measured: {workers}.", "")
        return
    report.add(
        f"The keyed job through the service (shards of {workers.keys_per_shard:,} keys; upload "
        f"of the Parquet file {workers.upload_seconds:.0f} s, not counted). Wall time from "
        "`POST /fit` to the job's success, which includes planning the shards and the job's "
        "global model (a search of 10 s at most):",
        "",
    )
    rows = []
    for run in workers.runs:
        for index, watch in enumerate(run.workers):
            role = "runs the job" if watch.pid == run.job_worker_pid else "shard tasks"
            rows.append(
                [
                    f"{run.n_workers}",
                    f"{run.seconds:.1f} s" if index == 0 else "",
                    f"{run.shard_seconds:.1f} s ({n_accounts / run.shard_seconds:.1f} keys/s)"
                    if index == 0 and run.shard_seconds > 0
                    else "",
                    f"worker {index} ({role})",
                    f"{run.shards_by_worker.get(watch.pid, 0)}",
                    f"{watch.own_mib:.0f} MiB",
                    f"{watch.fork_server_kib / 1024:.0f} MiB",
                    f"{watch.largest_child_mib:.0f} MiB",
                ]
            )
    report.table(
        [
            "workers",
            "keyed job wall time",
            "of which the shards",
            "worker",
            "shards it fitted",
            "peak RSS, worker process",
            "its fork server (libraries only)",
            "its largest fit process",
        ],
        rows,
    )
    sizes = (
        f"The rows take {_mib(n_accounts * n_ratings):.0f} MiB as float64 (X and y), "
        f"a shard's rows {_mib(workers.keys_per_shard * n_ratings):.1f} MiB, the global "
        f"model's sample (at most {global_rows:,} rows, `MIXREG_KEYED_GLOBAL_ROWS`) "
        f"{_mib(min(global_rows, n_accounts * n_ratings)):.1f} MiB; a fit process starts from "
        "its fork server's memory. "
        f"Peak RSS of the API process (upload included): {workers.api_peak_mib:.0f} MiB. "
    )
    if len(workers.runs) == 2:
        one, two = workers.runs
        sizes += (
            f"Time with 2 workers / with 1: {two.seconds / one.seconds:.2f} for the whole job, "
            f"{two.shard_seconds / max(one.shard_seconds, 1e-9):.2f} for its shards (both "
            "workers share this machine's 2 cores with everything else running on it; the "
            "1-worker run comes first). "
        )
    report.add(
        sizes + "The shards' time starts at the first poll (every 0.2 s) that sees the keys "
        "counted, once the global model is fitted (other workers fit shards meanwhile). The "
        "process that runs the job reads the key column chunk by chunk to plan the shards, "
        "then holds the global model's sample and one shard's rows at a time; a shard task's "
        "process holds its shard's rows and one chunk.",
        "",
    )


def _mib(n_rows: int) -> float:
    """MiB of ``n_rows`` rows of X (d = 4) and y as float64."""
    return n_rows * 5 * 8 / 2**20


def _memory_run(args: argparse.Namespace, command: str) -> None:
    """The keyed job alone, on 2 workers, on data many times a shard: the section
    ``keyed-memory``."""
    report = Report()
    n_rows = args.accounts * args.ratings
    keys_per_shard = args.keys_per_shard or -(-args.accounts // 16)
    report.add(
        f"## A keyed job's memory, data many times a shard ({args.accounts:,} accounts x "
        f"{args.ratings} ratings = {n_rows:,} rows, d = 4, k = 2)",
        "",
    )
    report.add("Machine and run:", "", *machine_lines(command), "")
    report.add(
        "Measured here: one keyed job through the service on PostgreSQL (`mixreg serve`, two "
        "`mixreg worker --concurrency 1`), in "
        f"{-(-args.accounts // keys_per_shard)} shards, and the peak memory (VmHWM) of the "
        "API process and of each worker's processes, beside the data's size. The job's own "
        "fit process plans the shards from the key column and fits the global model on a "
        "random sample of rows; no process loads every row.",
        "",
    )
    log("generating the accounts")
    X, y, account, _ = make_shared_accounts(
        n_accounts=args.accounts, n_ratings=args.ratings, n_features=4, random_state=0
    )
    log(f"the keyed job through the service, in shards of {keys_per_shard:,} keys")
    workers = measure_workers(
        X,
        y,
        account,
        keys_per_shard=keys_per_shard,
        worker_counts=(2,),
        global_rows=args.global_rows,
    )
    _workers_report(report, workers, args.accounts, args.ratings, args.global_rows)
    report.add(f"Load average (1, 5, 15 min) at the end: {load_average()}", "")
    write_section(args.output, MEMORY_SECTION, "\n".join(report.lines))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.keyed",
        description="Keyed fits vs a loop of the default estimator; keyed single-row predict; "
        "write the keyed section of bench/RESULTS.md.",
    )
    parser.add_argument("--accounts", type=int, default=FULL_ACCOUNTS)
    parser.add_argument("--ratings", type=int, default=200)
    parser.add_argument("--sample", type=int, default=100, help="accounts of the default loop")
    parser.add_argument("--predict-keys", type=int, default=1_000_000)
    parser.add_argument(
        "--keys-per-shard",
        type=int,
        default=None,
        help="shard size of the keyed job through the service (default: a 16th of the accounts)",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="only the keyed job through the service, on 2 workers, with its processes' peak "
        "memory beside the data's size: the keyed-memory section",
    )
    parser.add_argument(
        "--global-rows",
        type=int,
        default=DEFAULT_KEYED_GLOBAL_ROWS,
        help="MIXREG_KEYED_GLOBAL_ROWS of the service: rows of the job's global model at most",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    command = " ".join(["python -m bench.keyed", *(sys.argv[1:] if argv is None else argv)])
    if args.memory:
        _memory_run(args, command)
        return
    report = Report()
    n_rows = args.accounts * args.ratings
    report.add(
        f"## Keyed fits ({args.accounts:,} accounts x {args.ratings} ratings = {n_rows:,} rows, "
        "d = 4, k = 2)",
        "",
    )
    report.add("Machine and run:", "", *machine_lines(command), "")
    if args.accounts < FULL_ACCOUNTS:
        report.add(
            f"A reduced size: the issue's {FULL_ACCOUNTS:,} accounts are `make bench-keyed` "
            "(`python -m bench.keyed`).",
            "",
        )
    report.add(
        "Measured here: the keyed estimator (the keyed job's fit) in one process against a loop "
        "of the default estimator; then the same accounts as one keyed job through the service "
        "on PostgreSQL (`mixreg serve`, `mixreg worker --concurrency 1`), with 1 worker and "
        "then 2 workers on this one machine, and the peak memory (VmHWM) of the API process "
        "and of each worker's processes.",
        "",
    )
    log("generating the accounts")
    X, y, account, _ = make_shared_accounts(
        n_accounts=args.accounts, n_ratings=args.ratings, n_features=4, random_state=0
    )
    sample = np.sort(
        np.random.default_rng(1).choice(args.accounts, size=args.sample, replace=False)
    )
    # The two fits alternate over quarters of the accounts (and of the sample), so that a
    # change of the machine's load hits both alike.
    keyed_seconds, loop_seconds = 0.0, 0.0
    keyed_losses: list[np.ndarray] = []
    default_parts: list[np.ndarray] = []
    for quarter in np.array_split(np.arange(args.accounts), QUARTERS):
        log(f"fit_per_key over accounts {quarter[0]} to {quarter[-1]}")
        rows = np.flatnonzero((account >= quarter[0]) & (account <= quarter[-1]))
        started = time.perf_counter()
        keyed = fit_per_key(X[rows], y[rows], account[rows], 2, random_state=0, global_model=False)
        keyed_seconds += time.perf_counter() - started
        keyed_losses.append(keyed.min_loss)
        in_quarter = sample[(sample >= quarter[0]) & (sample <= quarter[-1])]
        if in_quarter.size == 0:
            continue
        log(f"the default estimator on {in_quarter.size} of them, one at a time")
        per_account, losses = _default_loop(X, y, account, in_quarter)
        loop_seconds += per_account * in_quarter.size
        default_parts.append(losses)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    all_losses = np.concatenate(keyed_losses)
    default_losses = np.concatenate(default_parts)
    per_account = loop_seconds / args.sample
    ratios = all_losses[sample] / default_losses
    keys_per_second = args.accounts / keyed_seconds
    loop_keys_per_second = 1 / per_account
    speedup = keys_per_second / loop_keys_per_second
    log(f"single-row predicts among {args.predict_keys:,} keys")
    keyed_predict, plain_predict = _predict_seconds(args.predict_keys, 20_000)
    log(f"single-row requests through the app among {args.predict_keys:,} keys")
    with tempfile.TemporaryDirectory(prefix="mixreg-bench-keyed-") as folder:
        keyed_request, plain_request = _endpoint_seconds(args.predict_keys, 1000, Path(folder))
    keys_per_shard = args.keys_per_shard or -(-args.accounts // 16)
    log(f"the keyed job through the service, in shards of {keys_per_shard:,} keys")
    workers = measure_workers(
        X, y, account, keys_per_shard=keys_per_shard, global_rows=args.global_rows
    )
    ratio_q = np.quantile(ratios, [0.5, 0.99, 1.0])
    report.table(
        ["measure", "value"],
        [
            [
                f"fit_per_key, every account (in {QUARTERS} calls)",
                f"{keyed_seconds:.1f} s ({keys_per_second:.0f} keys/s)",
            ],
            [
                f"default estimator, {args.sample} sampled accounts one at a time",
                f"{per_account:.2f} s per account ({loop_keys_per_second:.2f} keys/s; "
                f"{args.accounts * per_account / 3600:.1f} h extrapolated to every account)",
            ],
            ["speed-up of fit_per_key", f"{speedup:.0f}x"],
            [
                "min-loss ratio keyed / default on the sample (median, q99, max)",
                ", ".join(f"{value:.5f}" for value in ratio_q),
            ],
            ["sampled accounts with ratio <= 1.001", f"{np.mean(ratios <= 1.001):.1%}"],
            ["peak memory (max RSS) of the fitting process", f"{peak_mib:.0f} MiB"],
            [
                f"single-row predict, keyed among {args.predict_keys:,} keys (serving code)",
                f"{keyed_predict * 1e6:.1f} us",
            ],
            ["single-row predict, plain model (serving code)", f"{plain_predict * 1e6:.1f} us"],
            [
                f"single-row POST /models/{{id}}/predict through the app, keyed among "
                f"{args.predict_keys:,} keys",
                f"{keyed_request * 1e6:.0f} us",
            ],
            [
                "single-row POST /models/{id}/predict through the app, plain model",
                f"{plain_request * 1e6:.0f} us",
            ],
        ],
    )
    _workers_report(report, workers, args.accounts, args.ratings, args.global_rows)
    report.target("keyed fit speed-up", ">= 20x", f"{speedup:.0f}x", speedup >= 20)
    report.target(
        "median min-loss ratio", "<= 1.001", f"{ratio_q[0]:.5f}", bool(ratio_q[0] <= 1.001)
    )
    throughput = plain_request / keyed_request
    report.target(
        "keyed / plain single-row predict throughput (requests through the app)",
        ">= 0.9x",
        f"{throughput:.2f}x",
        throughput >= 0.9,
    )
    report.targets_table(report.targets)
    report.add(f"Load average (1, 5, 15 min) at the end: {load_average()}", "")
    write_section(args.output, SECTION, "\n".join(report.lines))


if __name__ == "__main__":
    main()
