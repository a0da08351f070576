"""Prediction log and outcomes benchmark: single-row predict throughput with the log off, at
1 % and at 100 % (side by side, one server, one run), and the rolling min-loss of posted
outcomes beside the min-loss computed offline from the same rows.

One server (uvicorn with the app factory, as ``mixreg serve`` runs it, on a SQLite file in a
temporary folder) serves every run: the log's rate for the model is set over HTTP between
runs (``PUT /prediction-log/settings/{model}``; no setting is "off"), the modes alternating
round by round, so the three see the same process, database and machine load.

``python -m bench.outcomes`` writes its section of ``bench/RESULTS.md`` between the lines
``<!-- outcomes:start -->`` and ``<!-- outcomes:end -->``; ``--quick`` runs a smaller version
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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.sections import Report, load_average, log, machine_lines, write_section
from bench.servers import ServerProcess
from bench.serving import (
    N_COMPONENTS,
    SERVING_PACKAGES,
    fit_model,
    httpx_load,
    make_data,
    wrk_load,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "outcomes"
THROUGHPUT_TARGET = 0.95
MODES = {"off": None, "1 %": 0.01, "100 %": 1.0}


@dataclass(frozen=True)
class Settings:
    load_seconds: int
    connections: tuple[int, ...]
    rounds: int
    outcome_requests: int


# Short runs, many rounds in a rotating order: on a shared machine the load of others changes
# from second to second, and many short interleaved runs share it out evenly among the modes.
FULL = Settings(load_seconds=5, connections=(1, 8), rounds=6, outcome_requests=2000)
QUICK = Settings(load_seconds=2, connections=(8,), rounds=1, outcome_requests=500)


def app_server(folder: Path) -> ServerProcess:
    """The app under uvicorn, as ``mixreg serve`` starts it, on a new SQLite file."""
    return ServerProcess(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "service.main:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--proxy-headers",
        ],
        env={**os.environ, "MIXREG_DATABASE_URL": f"sqlite:///{folder / 'outcomes.db'}"},
        log_path=folder / "outcomes.log",
    )


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def set_rate(client: httpx.Client, model_id: str, rate: float | None) -> None:
    target = f"/prediction-log/settings/{model_id}"
    if rate is None:
        response = client.delete(target)
        if response.status_code != 404:
            response.raise_for_status()
    else:
        client.put(target, json={"sample_rate": rate}).raise_for_status()


def run_throughput(
    report: Report, settings: Settings, folder: Path, server: ServerProcess, model_id: str
) -> None:
    load = wrk_load if shutil.which("wrk") else httpx_load
    generator = "wrk, 1 thread" if load is wrk_load else "an async httpx loop (no wrk installed)"
    row = make_data(1)[0][0].tolist()
    body = json.dumps({"model_id": model_id, "X": [row]}).encode()
    url = f"{server.url}/predict"
    rows = []
    cpu_off: list[float] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for connections in settings.connections:
            rates: dict[str, list[float]] = {mode: [] for mode in MODES}
            p99: dict[str, list[float]] = {mode: [] for mode in MODES}
            # The server's CPU time per answered request: what the log costs whatever the
            # other processes on the machine take from it.
            cpu_us: dict[str, list[float]] = {mode: [] for mode in MODES}
            errors = 0
            order = list(MODES)
            for round_number in range(settings.rounds):
                # Each round in another order, so no mode always follows the same one.
                shift = round_number % len(order)
                turn = order[shift:] + order[:shift]
                if round_number % 2:
                    turn.reverse()
                for mode in turn:
                    set_rate(client, model_id, MODES[mode])
                    log(f"log {mode}: {connections} connections, round {round_number + 1}")
                    load(url, body, connections=connections, seconds=1, folder=folder)
                    cpu_before = cpu_seconds(server.pid)
                    result = load(
                        url,
                        body,
                        connections=connections,
                        seconds=settings.load_seconds,
                        folder=folder,
                    )
                    answered = result.requests_per_s * settings.load_seconds
                    cpu_us[mode].append((cpu_seconds(server.pid) - cpu_before) / answered * 1e6)
                    rates[mode].append(result.requests_per_s)
                    p99[mode].append(result.p99_ms)
                    errors += result.errors
            medians = {mode: statistics.median(rates[mode]) for mode in MODES}
            cpu = {mode: statistics.median(cpu_us[mode]) for mode in MODES}
            cpu_off.extend(cpu_us["off"])
            rows.append(
                [
                    str(connections),
                    *(f"{medians[mode]:,.0f}" for mode in MODES),
                    f"{medians['1 %'] / medians['off']:.3f}x",
                    f"{medians['100 %'] / medians['off']:.3f}x",
                    " / ".join(f"{cpu[mode]:.0f}" for mode in MODES),
                    f"{cpu['off'] / cpu['100 %']:.3f}x",
                    " / ".join(f"{statistics.median(p99[mode]):.2f}" for mode in MODES),
                    str(errors),
                ]
            )
            for mode in ("1 %", "100 %"):
                ratio = medians[mode] / medians["off"]
                report.target(
                    f"predict with the log at {mode} vs off, {connections} connections",
                    f"≥ {THROUGHPUT_TARGET}x",
                    f"{ratio:.3f}x",
                    ratio >= THROUGHPUT_TARGET and errors == 0,
                )
                cpu_ratio = cpu["off"] / cpu[mode]
                report.target(
                    f"server CPU per request, off / log at {mode}, {connections} connections",
                    f"≥ {THROUGHPUT_TARGET}x",
                    f"{cpu_ratio:.3f}x",
                    cpu_ratio >= THROUGHPUT_TARGET,
                )
        set_rate(client, model_id, None)
        time.sleep(1.0)  # the last rows written
        exported = client.get("/metrics").text

    def exported_value(prefix: str) -> float:
        return next(
            float(line.split()[-1]) for line in exported.splitlines() if line.startswith(prefix)
        )

    dropped = int(exported_value('mixreg_prediction_log_rows_total{state="dropped"}'))
    written = exported_value('mixreg_prediction_log_rows_total{state="written"}')
    writer_us = exported_value("mixreg_prediction_log_writer_cpu_seconds_total") / written * 1e6
    off_us = statistics.median(cpu_off)
    writer_ratio = off_us / (off_us + writer_us)
    report.target(
        "server CPU per request without / with its row written by the log",
        f"≥ {THROUGHPUT_TARGET}x",
        f"{writer_ratio:.3f}x ({writer_us:.0f} µs per row beside {off_us:.0f} µs per request)",
        writer_ratio >= THROUGHPUT_TARGET,
    )
    report.add(
        "### Single-row predict with the prediction log off, at 1 % and at 100 %",
        "",
        f"`POST /predict` with one row and a model of k = {N_COMPONENTS} lines of 20 features, "
        f"by id. One server; the log's rate set over HTTP between runs. Load: {generator}; "
        f"{settings.load_seconds} s per run after a 1 s warm-up, the three modes in a rotating "
        f"order, {settings.rounds} rounds; the median of the rounds. Latencies in ms. Written "
        f"by the log: {written:,.0f} rows. Server "
        f"CPU per request: the server process's user and system time (all its threads, the "
        f"log's writer included) during a run over the requests it answered; it does not "
        f"depend on what other processes take from the machine as much as rates do (it "
        f"still grows when they evict its caches). The log writer's CPU per row: its own CPU "
        f"time (the thread's, exported on /metrics) over the rows it wrote in the whole run. "
        f"Rows "
        f"dropped by a full queue over the whole run: {dropped}.",
        "",
    )
    report.table(
        [
            "connections",
            *(f"{mode} req/s" for mode in MODES),
            "1 % / off",
            "100 % / off",
            "server CPU µs per request " + " / ".join(MODES),
            "off / 100 % CPU per request",
            "p99 " + " / ".join(MODES),
            "errors",
        ],
        rows,
    )


def run_min_loss(report: Report, settings: Settings, server: ServerProcess, model_id: str) -> None:
    """Predict held-out rows through the log, post their real targets as outcomes, and
    compare the served rolling min-loss with the one computed offline from the answers."""
    X, y = make_data(4 * settings.outcome_requests, seed=99)
    rng = np.random.default_rng(5)
    answers: list[tuple[str, np.ndarray, np.ndarray]] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        set_rate(client, model_id, 1.0)
        at = 0
        started = time.perf_counter()
        for number in range(settings.outcome_requests):
            n_rows = int(rng.integers(1, 5))
            request_id = f"bench-{number}"
            response = client.post(
                "/predict",
                json={"model_id": model_id, "X": X[at : at + n_rows].tolist()},
                headers={"X-Request-ID": request_id},
            )
            response.raise_for_status()
            answers.append(
                (request_id, np.array(response.json()["predictions"]), y[at : at + n_rows])
            )
            at += n_rows
        predict_s = time.perf_counter() - started
        time.sleep(1.0)  # the log is written every 0.5 s
        outcomes = [
            {"request_id": request_id, "row": row, "y": float(target)}
            for request_id, _, targets in answers
            for row, target in enumerate(targets)
        ]
        started = time.perf_counter()
        for first in range(0, len(outcomes), 1000):
            client.post(
                "/outcomes", json={"outcomes": outcomes[first : first + 1000]}
            ).raise_for_status()
        post_s = time.perf_counter() - started
        started = time.perf_counter()
        metrics = client.get(
            "/outcomes/metrics", params={"model": model_id, "window": "day", "tolerance": 1.0}
        )
        metrics.raise_for_status()
        query_s = time.perf_counter() - started
        set_rate(client, model_id, None)
    windows = metrics.json()["windows"]
    served_count = sum(window["count"] for window in windows)
    served = sum(window["min_loss"] * window["count"] for window in windows) / served_count
    squared = np.concatenate(
        [((targets[:, None] - predictions) ** 2).min(axis=1) for _, predictions, targets in answers]
    )
    offline = float(squared.mean())
    relative = abs(served - offline) / offline
    report.target(
        "rolling min-loss from outcomes vs offline on the same rows",
        "equal (relative difference ≤ 1e-12)",
        f"{served:.6f} vs {offline:.6f} ({relative:.1e})",
        relative <= 1e-12 and served_count == len(squared),
    )
    report.add(
        "### Rolling min-loss from outcomes beside the offline min-loss",
        "",
        f"{settings.outcome_requests:,} predict requests of 1 to 4 held-out rows each "
        f"({len(squared):,} rows) with the log at 100 %, each with its own `X-Request-ID`; "
        f"their real targets posted as outcomes in bodies of 1,000; then "
        f"`GET /outcomes/metrics?window=day`. Offline: the mean over the same rows of "
        f"min_j (y - prediction_j)^2 from the answers the client received.",
        "",
    )
    report.table(
        [
            "rows",
            "served min-loss",
            "offline min-loss",
            "predict (s)",
            "post outcomes (rows/s)",
            "metrics query (ms)",
        ],
        [
            [
                f"{len(squared):,}",
                f"{served:.9f}",
                f"{offline:.9f}",
                f"{predict_s:.1f}",
                f"{len(outcomes) / post_s:,.0f}",
                f"{query_s * 1000:.1f}",
            ]
        ],
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outcomes",
        description="Benchmark predict throughput with the prediction log and the outcome "
        "metrics; write the outcomes section of bench/RESULTS.md.",
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--output", type=Path, help="Markdown file whose section is written")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    output = args.output if args.output or args.quick else DEFAULT_OUTPUT
    command = " ".join(["python -m bench.outcomes", *(sys.argv[1:] if argv is None else argv)])
    started = time.perf_counter()
    body = Report()
    with tempfile.TemporaryDirectory(prefix="mixreg-bench-outcomes-") as name:
        folder = Path(name)
        server = app_server(folder)
        server.start("/healthz")
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                model_id, _ = fit_model(client)
            run_throughput(body, settings, folder, server, model_id)
            run_min_loss(body, settings, server, model_id)
        finally:
            server.stop()
    elapsed = time.perf_counter() - started
    report = Report()
    report.add("## Outcomes and drift (issue 31)", "")
    if args.quick:
        report.add("**Quick smoke run: shorter load runs, fewer requests.**", "")
    report.add(
        "Machine and run (a shared machine: other people's work ran beside this one, so "
        "only the ratios measured side by side in one run mean much):",
        "",
        *machine_lines(command, SERVING_PACKAGES),
        "",
    )
    report.targets_table(body.targets)
    report.add(
        "What is measured: the log's cost to predict (a sampling check per request, a queue "
        "append per sampled request, and a writer thread in the same process that computes "
        "the sampled rows' k values again and writes them every 0.5 s in one transaction), "
        "and that the min-loss served from outcomes is the min-loss of the same rows computed "
        "offline. The load average printed above says how busy the shared machine was: "
        "absolute request rates are far below what the same code serves on an idle machine "
        "(bench/RESULTS.md, Serving), and only the ratios of runs interleaved in one process "
        "compare anything.",
        "",
    )
    report.add(
        f"Total time: {elapsed / 60:.1f} min; load average at the end: {load_average()}.", ""
    )
    report.lines.extend(body.lines)
    if output is not None:
        write_section(output, SECTION, "\n".join(report.lines))
        log(f"wrote the outcomes section of {output}")


if __name__ == "__main__":
    main()
