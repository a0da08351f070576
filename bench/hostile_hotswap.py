"""Hot swaps under load: clients predict by ``name@alias`` while the alias moves and each old
version is deleted right after its move.

Two API processes share one database (SQLite file, and PostgreSQL when reachable); the first
runs the embedded worker. ``--clients`` client threads, spread over both processes and over
``POST /predict``, ``POST /models/{ref}/predict`` and the Open Inference Protocol, predict one
row by ``reco@production`` back to back. Meanwhile the alias moves ``--moves`` times, every
``--interval`` seconds, through each process in turn, and right after each move the version it
left is deleted through the other process. Every answer must be a 2xx wholly from one version
(its id, number and predictions agree); the run prints the counts of 2xx and non-2xx answers,
the versions that answered, and the predict latency p50 / p99.

``python -m bench.hostile_hotswap [--moves 40] [--interval 0.25] [--clients 4]
[--backends sqlite,postgresql]``. The end-to-end test
``tests/e2e/test_e2e_hot_swap.py`` runs the same scenario, shorter.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.load import DEFAULT_POSTGRES_URL, fresh_postgres_database
from bench.servers import ServerProcess

NAME = "reco"
ALIAS = "production"
REFERENCE = f"{NAME}@{ALIAS}"
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
UVICORN_APP = [
    *(sys.executable, "-m", "uvicorn", "--factory", "service.main:create_app"),
    *("--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"),
]
# The three ways of predicting by reference, taken by the clients in turn.
ROUTES = ("predict", "model predict", "inference protocol")


def mixture_data(n_rows: int = 120, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Rows from two noisy lines in three features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, 3))
    lines = np.array([[1.0, 2.0, -1.0], [-2.0, 0.5, 1.5]])
    labels = rng.integers(0, 2, size=n_rows)
    y = np.einsum("ij,ij->i", X, lines[labels]) + np.where(labels, 1.0, -1.0)
    return X, y + 0.05 * rng.standard_normal(n_rows)


def prepare_versions(client: httpx.Client, count: int, *, timeout_s: float = 120) -> dict[int, str]:
    """Fit version 1 of ``reco``, then import ``count - 1`` copies of it with shifted
    intercepts as versions 2, 3, ... (an import is quicker than a fit); their model ids by
    version."""
    X, y = mixture_data()
    submitted = client.post(
        "/fit",
        json={
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "seed": 1,
            "registered_model": NAME,
        },
    )
    submitted.raise_for_status()
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/jobs/{submitted.json()['job_id']}").json()
        if job["status"] in TERMINAL:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fit did not finish within {timeout_s} s: {job}")
        time.sleep(0.05)
    if job["status"] != "succeeded":
        raise RuntimeError(f"the fit failed: {job}")
    model_ids = {1: str(job["model_id"])}
    document = client.get(f"/models/{model_ids[1]}/export").json()
    for version in range(2, count + 1):
        shifted = {
            **document,
            "intercept": [value + 100.0 * version for value in document["intercept"]],
        }
        imported = client.post("/models/import", params={"registered_model": NAME}, json=shifted)
        imported.raise_for_status()
        if imported.json()["version"] != version:
            raise RuntimeError(f"the import became {imported.json()}, not version {version}")
        model_ids[version] = str(imported.json()["id"])
    return model_ids


@dataclass
class Outcome:
    """What the clients and the mover saw."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    versions: Counter[int] = field(default_factory=Counter)
    # Answers that were not wholly one version, or not a known one: (route, detail).
    wrong: list[tuple[str, str]] = field(default_factory=list)
    failures: list[tuple[str, int, str]] = field(default_factory=list)
    move_statuses: Counter[int] = field(default_factory=Counter)
    delete_statuses: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> int:
        return sum(count for status, count in self.statuses.items() if 200 <= status < 300)

    @property
    def not_ok(self) -> int:
        return sum(self.statuses.values()) - self.ok


def _answer(route: str, response: httpx.Response) -> tuple[int | None, list[float]]:
    """The version and the predictions of a 2xx answer of ``route``."""
    body: dict[str, Any] = response.json()
    if route == "inference protocol":
        outputs = {output["name"]: output for output in body["outputs"]}
        return int(body["model_version"]), list(outputs["predictions"]["data"])
    return body.get("version"), list(body["predictions"][0])


def _predict_loop(
    url: str,
    route: str,
    row: list[float],
    expected: dict[int, list[float]],
    stop: threading.Event,
    outcome: Outcome,
    lock: threading.Lock,
) -> None:
    body: dict[str, object]
    if route == "predict":
        path, body = "/predict", {"model_id": REFERENCE, "X": [row]}
    elif route == "model predict":
        path, body = f"/models/{REFERENCE}/predict", {"X": [row]}
    else:
        path = f"/v2/models/{REFERENCE}/infer"
        body = {"inputs": [{"name": "X", "shape": [1, len(row)], "datatype": "FP64", "data": row}]}
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                response = client.post(path, json=body)
            except httpx.TransportError as error:
                with lock:
                    outcome.statuses[0] += 1
                    outcome.failures.append((route, 0, repr(error)))
                continue
            elapsed = time.perf_counter() - sent
            with lock:
                outcome.statuses[response.status_code] += 1
                outcome.latencies_s.append(elapsed)
                if not 200 <= response.status_code < 300:
                    outcome.failures.append((route, response.status_code, response.text[:300]))
                    continue
                version, predictions = _answer(route, response)
                if version not in expected or not np.allclose(predictions, expected[version]):
                    outcome.wrong.append((route, f"version {version}: {predictions}"))
                    continue
                outcome.versions[version] += 1


def run_hot_swaps(
    urls: Sequence[str],
    model_ids: dict[int, str],
    *,
    clients: int = 4,
    interval_s: float = 0.25,
    settle_s: float = 0.5,
) -> Outcome:
    """Point the alias at version 1, start ``clients`` predicting by it (spread over ``urls``
    and :data:`ROUTES`), then move it to each next version every ``interval_s`` and delete the
    version it left right after; stop the clients ``settle_s`` after the last move."""
    row = mixture_data(n_rows=1, seed=9)[0][0].tolist()
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(httpx.Client(base_url=url, timeout=30)) for url in urls]
        expected = {}
        for version, model_id in model_ids.items():
            answer = sessions[0].post(f"/models/{model_id}/predict", json={"X": [row]})
            answer.raise_for_status()
            expected[version] = list(answer.json()["predictions"][0])
        alias_path = f"/registered-models/{NAME}/aliases/{ALIAS}"
        sessions[0].put(alias_path, json={"version": 1}).raise_for_status()

        outcome = Outcome()
        lock = threading.Lock()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=_predict_loop,
                args=(
                    urls[index % len(urls)],
                    ROUTES[index % len(ROUTES)],
                    row,
                    expected,
                    stop,
                    outcome,
                    lock,
                ),
                daemon=True,
            )
            for index in range(clients)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            time.sleep(interval_s)
            versions = sorted(model_ids)
            for index, (old, new) in enumerate(itertools.pairwise(versions)):
                mover, deleter = (
                    sessions[index % len(sessions)],
                    sessions[(index + 1) % len(sessions)],
                )
                moved = mover.put(alias_path, json={"version": new})
                deleted = deleter.delete(f"/models/{model_ids[old]}")
                with lock:
                    outcome.move_statuses[moved.status_code] += 1
                    outcome.delete_statuses[deleted.status_code] += 1
                time.sleep(interval_s)
            time.sleep(settle_s)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        outcome.seconds = time.monotonic() - started
    return outcome


# --------------------------------------------------------------------------- the benchmark


def _servers(database_url: str, folder: Path, refresh_s: str) -> list[ServerProcess]:
    base = {
        **os.environ,
        "MIXREG_DATABASE_URL": database_url,
        "MIXREG_ALIAS_REFRESH_S": refresh_s,
    }
    return [
        ServerProcess(UVICORN_APP, env=base, log_path=folder / "api-0.log"),
        ServerProcess(
            UVICORN_APP,
            env={**base, "MIXREG_EMBEDDED_WORKER": "false"},
            log_path=folder / "api-1.log",
        ),
    ]


def run_backend(
    database_url: str, folder: Path, args: argparse.Namespace
) -> tuple[Outcome, dict[int, str]]:
    servers = _servers(database_url, folder, args.alias_refresh)
    try:
        for server in servers:
            server.start()
        with httpx.Client(base_url=servers[0].url, timeout=120) as client:
            model_ids = prepare_versions(client, args.moves + 1)
        outcome = run_hot_swaps(
            [server.url for server in servers],
            model_ids,
            clients=args.clients,
            interval_s=args.interval,
        )
        return outcome, model_ids
    finally:
        for server in servers:
            server.stop()


def _ms(values: Sequence[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.1f}" if values else "-"


def report_lines(backend: str, outcome: Outcome) -> list[str]:
    answers = sum(outcome.statuses.values())
    lines = [
        f"{backend}: {answers} predictions in {outcome.seconds:.1f} s by {REFERENCE}: "
        f"{outcome.ok} 2xx, {outcome.not_ok} non-2xx, {len(outcome.wrong)} not wholly one "
        f"version; predict latency p50 {_ms(outcome.latencies_s, 50)} ms, "
        f"p99 {_ms(outcome.latencies_s, 99)} ms",
        f"  alias moves {dict(outcome.move_statuses)}, deletes of the old version "
        f"{dict(outcome.delete_statuses)}; answers per version "
        f"{dict(sorted(outcome.versions.items()))}",
    ]
    lines += [
        f"  non-2xx: {route} {status} {detail}" for route, status, detail in outcome.failures[:5]
    ]
    lines += [f"  mixed: {route} {detail}" for route, detail in outcome.wrong[:5]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenario on each backend and print its counts and latencies."""
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_hotswap", description=__doc__)
    parser.add_argument("--moves", type=int, default=40, help="alias moves (40)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between moves")
    parser.add_argument("--clients", type=int, default=4, help="predicting clients (4)")
    parser.add_argument(
        "--alias-refresh", default="1.0", help="MIXREG_ALIAS_REFRESH_S of both processes (1.0)"
    )
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    failed = False
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="mixreg-hotswap-") as tmp:
            folder = Path(tmp)
            if backend == "sqlite":
                outcome, _ = run_backend(f"sqlite:///{folder / 'mixreg.db'}", folder, args)
            elif backend == "postgresql":
                with fresh_postgres_database(args.postgres_url, "mixreg_hotswap") as url:
                    outcome, _ = run_backend(url, folder, args)
            else:
                parser.error(f"unknown backend {backend!r}; use sqlite and/or postgresql")
        print("\n".join(report_lines(backend, outcome)), flush=True)
        failed |= bool(outcome.not_ok or outcome.wrong)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
