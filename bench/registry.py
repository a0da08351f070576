"""Registered models benchmark: single-row predict throughput by ``name@alias`` beside the same
predictions by model id, and the time an alias move takes to reach clients of two API
processes.

Everything runs against the real server (``mixreg serve`` with its default settings, a SQLite
file in a temporary folder); the load generator is the serving benchmark's (``wrk`` if
installed, else an async httpx loop). The switch time is measured by client threads that
predict by ``name@alias`` without pause, half of them against each of two API processes on
the same database: for each move of the alias, the time from the end of the ``PUT`` request
to each client's first answer from the new version.

``python -m bench.registry`` writes its section of ``bench/RESULTS.md`` between the lines
``<!-- registry:start -->`` and ``<!-- registry:end -->``; ``--quick`` runs a smaller version
and writes only with ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.sections import Report, load_average, log, machine_lines, write_section
from bench.servers import ServerProcess
from bench.serving import (
    N_COMPONENTS,
    SERVING_PACKAGES,
    httpx_load,
    make_data,
    mixreg_server,
    wait_for_job,
    wrk_load,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "registry"
NAME = "bench"
ALIAS = "production"
THROUGHPUT_TARGET = 0.95


@dataclass(frozen=True)
class Settings:
    load_seconds: int
    concurrencies: tuple[int, ...]
    rounds: int
    switches: int
    clients: int


FULL = Settings(load_seconds=10, concurrencies=(1, 8, 32), rounds=3, switches=10, clients=8)
QUICK = Settings(load_seconds=2, concurrencies=(1, 8), rounds=1, switches=4, clients=4)


def fit_versions(client: httpx.Client, count: int) -> dict[int, str]:
    """Fit ``count`` versions of ``NAME`` on 2,000 rows; their model ids by version."""
    X, y = make_data(2000)
    dataset = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist()})
    dataset.raise_for_status()
    model_ids = {}
    for version in range(1, count + 1):
        job = client.post(
            "/fit",
            json={
                "dataset_id": dataset.json()["id"],
                "k": N_COMPONENTS,
                "seed": version,
                "registered_model": NAME,
            },
        )
        job.raise_for_status()
        finished = wait_for_job(client, job.json()["job_id"])
        if finished["status"] != "succeeded":
            raise RuntimeError(f"the fit failed: {finished}")
        model_ids[version] = str(finished["model_id"])
    return model_ids


def move_alias(client: httpx.Client, version: int) -> None:
    client.put(
        f"/registered-models/{NAME}/aliases/{ALIAS}", json={"version": version}
    ).raise_for_status()


def run_throughput(report: Report, settings: Settings, folder: Path) -> None:
    load = wrk_load if shutil.which("wrk") else httpx_load
    generator = "wrk, 1 thread" if load is wrk_load else "an async httpx loop (no wrk installed)"
    server = mixreg_server(folder, "throughput")
    server.start("/healthz")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            model_ids = fit_versions(client, 1)
            move_alias(client, 1)
            row = make_data(1)[0][0].tolist()
            bodies = {
                "id": json.dumps({"model_id": model_ids[1], "X": [row]}).encode(),
                "alias": json.dumps({"model_id": f"{NAME}@{ALIAS}", "X": [row]}).encode(),
            }
            for body in bodies.values():
                answer = client.post(
                    "/predict", content=body, headers={"content-type": "application/json"}
                )
                answer.raise_for_status()
        url = f"{server.url}/predict"
        rows = []
        for connections in settings.concurrencies:
            rates: dict[str, list[float]] = {"id": [], "alias": []}
            p99: dict[str, list[float]] = {"id": [], "alias": []}
            errors = 0
            for round_number in range(settings.rounds):
                for kind in ("id", "alias") if round_number % 2 == 0 else ("alias", "id"):
                    log(f"{kind}: {connections} connections, round {round_number + 1}")
                    load(url, bodies[kind], connections=connections, seconds=1, folder=folder)
                    result = load(
                        url,
                        bodies[kind],
                        connections=connections,
                        seconds=settings.load_seconds,
                        folder=folder,
                    )
                    rates[kind].append(result.requests_per_s)
                    p99[kind].append(result.p99_ms)
                    errors += result.errors
            by_id, by_alias = statistics.median(rates["id"]), statistics.median(rates["alias"])
            ratio = by_alias / by_id
            rows.append(
                [
                    str(connections),
                    f"{by_id:,.0f}",
                    f"{by_alias:,.0f}",
                    f"{ratio:.3f}x",
                    f"{statistics.median(p99['id']):.2f} / {statistics.median(p99['alias']):.2f}",
                    str(errors),
                ]
            )
            report.target(
                f"predict by {NAME}@{ALIAS} vs by id, {connections} connections",
                f"≥ {THROUGHPUT_TARGET}x",
                f"{ratio:.3f}x",
                ratio >= THROUGHPUT_TARGET and errors == 0,
            )
    finally:
        server.stop()
    report.add(
        "### Single-row predict by alias beside by id",
        "",
        f"`POST /predict` with one row and a model of k = {N_COMPONENTS} lines named by its id "
        f"or by `{NAME}@{ALIAS}` (`MIXREG_ALIAS_REFRESH_S` = 1 s, the default). Load: "
        f"{generator}; {settings.load_seconds} s per run after a 1 s warm-up, the two kinds "
        f"alternating, {settings.rounds} rounds; the median of the rounds. Latencies in ms.",
        "",
    )
    report.table(
        ["connections", "by id req/s", "by alias req/s", "ratio", "p99 id / alias", "errors"],
        rows,
    )


@dataclass
class Observation:
    """What one client saw: (sent, received, version) per answer, and its failures."""

    answers: list[tuple[float, float, int]]
    failures: int = 0


def _predict_forever(url: str, body: bytes, stop: threading.Event, seen: Observation) -> None:
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                response = client.post("/predict", content=body, headers=headers)
            except httpx.TransportError:
                seen.failures += 1
                continue
            if response.status_code != 200:
                seen.failures += 1
                continue
            seen.answers.append((sent, time.monotonic(), int(response.json()["version"])))


def run_switch(report: Report, settings: Settings, folder: Path) -> None:
    first = mixreg_server(folder, "switch")
    second = ServerProcess(
        [
            str(Path(sys.executable).with_name("mixreg")),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ],
        env={
            **os.environ,
            "MIXREG_DATABASE_URL": f"sqlite:///{folder / 'switch.db'}",
            "MIXREG_EMBEDDED_WORKER": "false",
        },
        log_path=folder / "switch-second.log",
    )
    first.start("/healthz")
    second.start("/healthz")
    stop = threading.Event()
    observations = [Observation([]) for _ in range(settings.clients)]
    threads: list[threading.Thread] = []
    try:
        with httpx.Client(base_url=first.url, timeout=120) as client:
            fit_versions(client, 2)
            move_alias(client, 1)
            body = json.dumps(
                {"model_id": f"{NAME}@{ALIAS}", "X": [make_data(1)[0][0].tolist()]}
            ).encode()
            servers = [first.url, second.url]
            threads = [
                threading.Thread(
                    target=_predict_forever,
                    args=(servers[index % 2], body, stop, observations[index]),
                )
                for index in range(settings.clients)
            ]
            for thread in threads:
                thread.start()
            time.sleep(2.0)
            moves: list[tuple[float, int]] = []
            for switch in range(settings.switches):
                version = 2 if switch % 2 == 0 else 1
                move_alias(client, version)
                moves.append((time.monotonic(), version))
                time.sleep(3.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        first.stop()
        second.stop()
    delays = []
    for moved_at, version in moves:
        for seen in observations:
            first_new = next(
                (
                    sent
                    for sent, _, answered in seen.answers
                    if sent >= moved_at and answered == version
                ),
                None,
            )
            if first_new is not None:
                delays.append(first_new - moved_at)
    failures = sum(seen.failures for seen in observations)
    answers = sum(len(seen.answers) for seen in observations)
    delays.sort()
    worst = delays[-1]
    report.target(
        "alias switch seen by every client (two API processes)",
        "≤ MIXREG_ALIAS_REFRESH_S (1 s) + a lookup, no failed request",
        f"max {worst:.2f} s, {failures} failed of {answers:,}",
        worst <= 1.25 and failures == 0,
    )
    report.add(
        "### Alias switch time seen by clients",
        "",
        f"{settings.clients} client threads predict by `{NAME}@{ALIAS}` without pause, half "
        f"against each of two API processes (`mixreg serve`, one of them without the embedded "
        f"worker) on one SQLite file; the alias moves {settings.switches} times between "
        f"versions 1 and 2, every 3 s. Delay: from the end of the `PUT` to a client's first "
        f"request that the new version answered; every answer names its version.",
        "",
    )
    report.table(
        ["moves", "client observations", "median", "90th percentile", "max", "answers", "failed"],
        [
            [
                str(settings.switches),
                str(len(delays)),
                f"{statistics.median(delays):.3f} s",
                f"{delays[int(0.9 * (len(delays) - 1))]:.3f} s",
                f"{worst:.3f} s",
                f"{answers:,}",
                str(failures),
            ]
        ],
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.registry",
        description="Benchmark predictions by alias and alias switches; write the registry "
        "section of bench/RESULTS.md.",
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer switches")
    parser.add_argument("--output", type=Path, help="Markdown file whose section is written")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    output = args.output if args.output or args.quick else DEFAULT_OUTPUT
    command = " ".join(["python -m bench.registry", *(sys.argv[1:] if argv is None else argv)])
    started = time.perf_counter()
    body = Report()
    with tempfile.TemporaryDirectory(prefix="mixreg-bench-registry-") as name:
        folder = Path(name)
        run_throughput(body, settings, folder)
        run_switch(body, settings, folder)
    elapsed = time.perf_counter() - started
    report = Report()
    report.add("## Registered models: predict by alias, alias switches (issue 20)", "")
    if args.quick:
        report.add("**Quick smoke run: shorter load runs, fewer switches.**", "")
    report.add("Machine and run:", "", *machine_lines(command, SERVING_PACKAGES), "")
    report.targets_table(body.targets)
    report.add(
        f"Total time: {elapsed / 60:.1f} min; load average at the end: {load_average()}.", ""
    )
    report.lines.extend(body.lines)
    if output is not None:
        write_section(output, SECTION, "\n".join(report.lines))
        log(f"wrote the registry section of {output}")


if __name__ == "__main__":
    main()
