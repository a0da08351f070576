"""Serving benchmark: single-row predict throughput beside bare FastAPI endpoints, 100,000-row
batches (JSON, .npy and the Open Inference Protocol), and 1,000,000 x 20 uploads (CSV and
Parquet) with their fits, timed and with peak memory.

Everything runs against the real server as a user gets it (``mixreg serve`` with its default
settings, a SQLite file in a temporary folder), without keys and with them (a read key sent by
every request). The bare endpoints (``bench/bare_endpoint.py``) parse the same JSON body into a
pydantic model and return a constant list of k floats, one as an ``async def`` route (the HTTP
stack's own rate), one as a ``def`` route (run in the thread pool); they are served by uvicorn
with the same settings, in the same run, the servers alternating, and the whole comparison is
run ``rounds`` times. The load generator is ``wrk`` (Debian's; ``make bench-serving`` installs
it) or, when it is missing, an async httpx loop; the same one drives every server.

Peak memory is measured as ``bench.algorithms`` does: the resident-set high-water mark
(``VmHWM``), reset through ``/proc/<pid>/clear_refs`` before the measured step, minus the
resident set before it. The API process is measured around each upload; the fit runs the
worker's fit path (``service.jobs.training.run_job``) in a fresh process, measured around the
whole job (reading the dataset from the database, fitting, storing the model).

``python -m bench.serving`` writes its section of ``bench/RESULTS.md`` between the lines
``<!-- serving:start -->`` and ``<!-- serving:end -->`` (appended if missing); ``--quick``
runs a smaller version and writes only with ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.sections import Report, load_average, log, machine_lines, write_section
from bench.servers import ServerProcess, proc_status_bytes, reset_peak_rss

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "serving"

N_COMPONENTS = 4
SERVING_PACKAGES = ("numpy", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pyarrow")
N_FEATURES = 20
DATA_SEED = 8

SERVING_K = 2
"""The single-row predictions' model has k = 2 lines (issue 34's serving row)."""
THROUGHPUT_TARGET = 1.0
P99_TARGET = 1.2
JSON_BATCH_TARGET_S = 1.0
BINARY_BATCH_TARGET_S = 0.2
API_MEMORY_TARGET = 3.0
WORKER_MEMORY_TARGET = 4.0


@dataclass(frozen=True)
class Settings:
    load_seconds: int
    concurrencies: tuple[int, ...]
    batch_rows: int
    upload_rows: int
    repeats: int
    rounds: int


FULL = Settings(
    load_seconds=10,
    concurrencies=(1, 8, 32),
    batch_rows=100_000,
    upload_rows=1_000_000,
    repeats=3,
    rounds=2,
)
QUICK = Settings(
    load_seconds=2,
    concurrencies=(1, 8, 32),
    batch_rows=100_000,
    upload_rows=50_000,
    repeats=1,
    rounds=1,
)


# --------------------------------------------------------------------------- processes


def mixreg_server(folder: Path, name: str, **settings: str) -> ServerProcess:
    """``mixreg serve`` with the default settings (plus ``settings``) on a new SQLite file."""
    mixreg = Path(sys.executable).with_name("mixreg")
    return ServerProcess(
        [str(mixreg), "serve", "--host", "127.0.0.1", "--port", "{port}"],
        env={**os.environ, "MIXREG_DATABASE_URL": f"sqlite:///{folder / f'{name}.db'}", **settings},
        log_path=folder / f"{name}.log",
    )


def bare_server(folder: Path, app: str) -> ServerProcess:
    """The bare endpoint ``app`` (``async_app`` or ``sync_app``) under ``python -m uvicorn``
    with uvicorn's defaults, as ``mixreg serve`` runs it (event loop and HTTP parser chosen
    alike, access log on)."""
    return ServerProcess(
        [
            sys.executable,
            "-m",
            "uvicorn",
            f"bench.bare_endpoint:{app}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ],
        env={**os.environ, "BARE_N_COMPONENTS": str(SERVING_K)},
        log_path=folder / f"{app}.log",
    )


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryWindow:
    """The resident set before a step and its high-water mark after it."""

    before: int
    peak: int
    reset: bool

    @property
    def extra(self) -> int:
        return self.peak - self.before


@contextlib.contextmanager
def measuring(pid: int | str) -> Iterator[list[MemoryWindow]]:
    """Measure the peak resident set of ``pid`` over the block."""
    reset = reset_peak_rss(pid)
    before = proc_status_bytes(pid, "VmRSS" if reset else "VmHWM")
    windows: list[MemoryWindow] = []
    yield windows
    windows.append(MemoryWindow(before, proc_status_bytes(pid, "VmHWM"), reset))


def fit_probe(job: dict[str, Any]) -> dict[str, Any]:
    """Claim the queued job and run the worker's fit path on it in this (fresh) process."""
    from models_store import jobs as job_store
    from models_store.session import make_engine, make_sessionmaker, session_scope
    from service.jobs import training

    engine = make_engine(job["database_url"])
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            claimed = job_store.claim_job(
                session, job_id=job["job_id"], worker_id="bench-probe", now=dt.datetime.now(dt.UTC)
            )
    finally:
        engine.dispose()
    if not claimed:
        raise RuntimeError(f"job {job['job_id']} was not queued")
    with measuring("self") as windows:
        started = time.perf_counter()
        status = training.run_job(job["job_id"], job["database_url"], worker_id="bench-probe")
        seconds = time.perf_counter() - started
    window = windows[0]
    return {
        "status": status,
        "seconds": seconds,
        "peak_extra": window.extra,
        "peak": window.peak,
        "reset": window.reset,
    }


def run_fit_probe(job_id: str, database_url: str) -> dict[str, Any]:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.serving",
            "--fit-probe",
            json.dumps({"job_id": job_id, "database_url": database_url}),
        ],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------- load generators


@dataclass(frozen=True)
class LoadResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _duration_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"not a wrk duration: {text}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def wrk_load(
    url: str,
    body: bytes,
    *,
    connections: int,
    seconds: int,
    folder: Path,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """``wrk`` POSTing ``body`` as JSON (with ``headers``) over ``connections`` connections
    (one thread)."""
    body_path = folder / "body.json"
    body_path.write_bytes(body)
    script = folder / "post.lua"
    extra = "".join(
        f'wrk.headers["{name}"] = "{value}"\n' for name, value in (headers or {}).items()
    )
    script.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"{extra}"
        f'local file = io.open("{body_path}", "rb")\n'
        "wrk.body = file:read('*a')\n"
        "file:close()\n"
    )
    completed = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    )
    out = completed.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _duration_ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _duration_ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    errors = int(non_2xx.group(1)) if non_2xx else 0
    if socket_errors:
        errors += sum(int(value) for value in socket_errors.groups())
    return LoadResult(rps, p50, p99, errors)


def httpx_load(
    url: str,
    body: bytes,
    *,
    connections: int,
    seconds: int,
    folder: Path,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """The same load from an async httpx loop: ``connections`` clients in a closed loop."""
    del folder
    extra_headers = headers or {}

    async def run() -> LoadResult:
        latencies: list[float] = []
        errors = 0
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        request_headers = {"content-type": "application/json", **extra_headers}
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            deadline = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal errors
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    response = await client.post(url, content=body, headers=request_headers)
                    latencies.append(time.perf_counter() - started)
                    if response.status_code != 200:
                        errors += 1

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(connections)))
            elapsed = time.perf_counter() - started
        latencies.sort()
        return LoadResult(
            requests_per_s=len(latencies) / elapsed,
            p50_ms=1e3 * latencies[len(latencies) // 2],
            p99_ms=1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            errors=errors,
        )

    return asyncio.run(run())


# --------------------------------------------------------------------------- data and models


def make_data(n_rows: int, seed: int = DATA_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Rows from k noisy lines in ``N_FEATURES`` features, rounded to 6 decimals (as a CSV
    export would write them)."""
    from mixreg.datasets import make_realizable

    X, y, *_ = make_realizable(
        n_samples=n_rows,
        n_features=N_FEATURES,
        n_components=N_COMPONENTS,
        noise=0.5,
        random_state=seed,
    )
    return np.round(X, 6), np.round(y, 6)


def wait_for_job(client: httpx.Client, job_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/jobs/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not finish within {timeout} s: {job}")
        time.sleep(0.2)


def fit_model(client: httpx.Client, k: int = N_COMPONENTS) -> tuple[str, np.ndarray]:
    """Upload 2,000 rows, fit ``k`` lines and return the model id and the rows."""
    X, y = make_data(2000)
    dataset = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist()})
    dataset.raise_for_status()
    job = client.post("/fit", json={"dataset_id": dataset.json()["id"], "k": k})
    job.raise_for_status()
    finished = wait_for_job(client, job.json()["job_id"])
    if finished["status"] != "succeeded":
        raise RuntimeError(f"the fit failed: {finished}")
    return str(finished["model_id"]), X


# --------------------------------------------------------------------------- section 1


SERVERS = ("mixreg", "mixreg, keys", "bare async", "bare def")
"""The servers of the single-row comparison, in the order they take turns."""


def _keyed_server(folder: Path) -> tuple[ServerProcess, str, str]:
    """``mixreg serve`` requiring keys (``MIXREG_API_KEYS``), and a write and a read key."""
    from service.auth.keys import environment_entry, new_key

    write, read = new_key(scope="write"), new_key(scope="read")
    entries = ",".join(environment_entry(made.record) for made in (write, read))
    return mixreg_server(folder, "throughput-keys", MIXREG_API_KEYS=entries), write.key, read.key


def _ratio_cell(values: list[float]) -> str:
    """The median of per-round ratios, with each round's in brackets."""
    rounds = ", ".join(f"{value:.2f}" for value in values)
    return f"{statistics.median(values):.2f}x ({rounds})"


def run_throughput_section(report: Report, settings: Settings, folder: Path) -> None:
    load = wrk_load if shutil.which("wrk") else httpx_load
    generator = (
        "wrk 1 thread (Debian's wrk)"
        if load is wrk_load
        else "an async httpx loop (wrk is not installed: `make bench-serving` installs it)"
    )
    if load is httpx_load:
        log("wrk not found: using an async httpx loop for every server")
    keyed, write_key, read_key = _keyed_server(folder)
    processes = {
        "mixreg": mixreg_server(folder, "throughput"),
        "mixreg, keys": keyed,
        "bare async": bare_server(folder, "async_app"),
        "bare def": bare_server(folder, "sync_app"),
    }
    request_headers: dict[str, dict[str, str]] = {name: {} for name in SERVERS}
    request_headers["mixreg, keys"] = {"Authorization": f"Bearer {read_key}"}
    bodies: dict[str, bytes] = {}
    # Per concurrency and server: one result per round.
    results: dict[int, dict[str, list[LoadResult]]] = {
        connections: {name: [] for name in SERVERS} for connections in settings.concurrencies
    }
    try:
        for process in processes.values():
            process.start("/healthz")
        for name in ("mixreg", "mixreg, keys"):
            setup = {"Authorization": f"Bearer {write_key}"} if name == "mixreg, keys" else {}
            url = processes[name].url
            with httpx.Client(base_url=url, timeout=120, headers=setup) as client:
                model_id, X = fit_model(client, k=SERVING_K)
                bodies[name] = json.dumps({"model_id": model_id, "X": [X[0].tolist()]}).encode()
        # The bare endpoints parse the same body.
        bodies["bare async"] = bodies["bare def"] = bodies["mixreg"]
        for name, process in processes.items():
            check = httpx.post(
                f"{process.url}/predict",
                content=bodies[name],
                headers={"content-type": "application/json", **request_headers[name]},
            )
            check.raise_for_status()
        for round_index in range(settings.rounds):
            for connections in settings.concurrencies:
                for name in SERVERS:
                    url = f"{processes[name].url}/predict"
                    log(
                        f"1) round {round_index + 1}: {name}, {connections} connections, "
                        f"{settings.load_seconds} s"
                    )
                    options = {
                        "connections": connections,
                        "folder": folder,
                        "headers": request_headers[name],
                    }
                    load(url, bodies[name], seconds=1, **options)  # warm-up
                    results[connections][name].append(
                        load(url, bodies[name], seconds=settings.load_seconds, **options)
                    )
    finally:
        for process in processes.values():
            process.stop()
    rows, ratio_rows = [], []
    for connections, by_server in results.items():
        for round_index in range(settings.rounds):
            row = [str(connections), str(round_index + 1)]
            for name in SERVERS:
                result = by_server[name][round_index]
                row.append(
                    f"{result.requests_per_s:,.0f} ({result.p50_ms:.2f} / {result.p99_ms:.2f})"
                )
            row.append(str(sum(by_server[name][round_index].errors for name in SERVERS)))
            rows.append(row)
        bare = by_server["bare async"]
        ratio_row = [str(connections)]
        for name in ("mixreg", "mixreg, keys"):
            throughput = [
                ours.requests_per_s / theirs.requests_per_s
                for ours, theirs in zip(by_server[name], bare, strict=True)
            ]
            p99 = [
                ours.p99_ms / theirs.p99_ms
                for ours, theirs in zip(by_server[name], bare, strict=True)
            ]
            versus_def = [
                ours.requests_per_s / theirs.requests_per_s
                for ours, theirs in zip(by_server[name], by_server["bare def"], strict=True)
            ]
            ratio_row += [_ratio_cell(throughput), _ratio_cell(p99), _ratio_cell(versus_def)]
            errors = sum(result.errors for result in by_server[name])
            report.target(
                f"single-row predict ({name}) vs bare async endpoint, {connections} connections",
                f"≥ {THROUGHPUT_TARGET}x",
                f"{statistics.median(throughput):.2f}x",
                statistics.median(throughput) >= THROUGHPUT_TARGET and errors == 0,
            )
            if connections == max(settings.concurrencies):
                report.target(
                    f"single-row predict ({name}) p99 vs bare async endpoint, "
                    f"{connections} connections",
                    f"≤ {P99_TARGET}x",
                    f"{statistics.median(p99):.2f}x",
                    statistics.median(p99) <= P99_TARGET,
                )
        ratio_rows.append(ratio_row)
    report.add(
        "### Single-row predict beside bare FastAPI endpoints",
        "",
        f"`POST /predict` with one row of {N_FEATURES} features and a model of k = {SERVING_K} "
        "lines, on `mixreg serve` with its defaults (embedded worker on, metrics, access log "
        "and the body size limit on), without keys and with keys (a read key in every "
        "request), against `bench/bare_endpoint.py` — FastAPI routes that parse the same body "
        f"into a pydantic model and return a constant list of {SERVING_K} floats, as `async "
        "def` (on the event loop) and as `def` (in the thread pool) — under the same uvicorn "
        f"settings. Load: {generator}, {settings.load_seconds} s per run after a 1 s warm-up; "
        f"the four servers take turns, and the whole comparison runs {settings.rounds} "
        "times (rounds). Each cell: req/s (p50 / p99 ms).",
        "",
    )
    report.table(["connections", "round", *SERVERS, "errors"], rows)
    report.add(
        "Ratios: the median over the rounds (each round's in brackets); throughput and p99 "
        "against the bare async endpoint, throughput against the bare def endpoint.",
        "",
    )
    report.table(
        [
            "connections",
            "mixreg / async",
            "mixreg p99 / async p99",
            "mixreg / def",
            "mixreg with keys / async",
            "with keys p99 / async p99",
            "with keys / def",
        ],
        ratio_rows,
    )


# --------------------------------------------------------------------------- section 2


def _timed(send: Any, repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls of ``send`` (after one warm-up) and the last
    response."""
    response = send()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = send()
        times.append(time.perf_counter() - started)
    return statistics.median(times), response


def run_batch_section(report: Report, settings: Settings, folder: Path) -> None:
    # The JSON batch (about 40 MB) is above the default MIXREG_MAX_PREDICT_JSON_BYTES: measured
    # with the limit raised to the body limit, to compare the encodings.
    server = mixreg_server(folder, "batch", MIXREG_MAX_PREDICT_JSON_BYTES=str(64 * 2**20))
    server.start("/healthz")
    rows = []
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            model_id, _ = fit_model(client)
            X, _ = make_data(settings.batch_rows, seed=DATA_SEED + 1)
            n = len(X)

            started = time.perf_counter()
            json_body = json.dumps({"model_id": model_id, "X": X.tolist()}).encode()
            json_encode = time.perf_counter() - started
            json_seconds, response = _timed(
                lambda: client.post(
                    "/predict", content=json_body, headers={"content-type": "application/json"}
                ),
                settings.repeats,
            )
            response.raise_for_status()
            started = time.perf_counter()
            from_json = np.asarray(response.json()["predictions"])
            json_decode = time.perf_counter() - started

            started = time.perf_counter()
            buffer = _npy(X)
            npy_encode = time.perf_counter() - started
            npy_seconds, response = _timed(
                lambda: client.post(
                    f"/models/{model_id}/predict",
                    content=buffer,
                    headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
                ),
                settings.repeats,
            )
            response.raise_for_status()
            started = time.perf_counter()
            from_npy = np.load(io.BytesIO(response.content))
            npy_decode = time.perf_counter() - started

            header = json.dumps(
                {
                    "inputs": [
                        {
                            "name": "X",
                            "shape": list(X.shape),
                            "datatype": "FP64",
                            "parameters": {"binary_data_size": X.nbytes},
                        }
                    ],
                    "outputs": [{"name": "predictions", "parameters": {"binary_data": True}}],
                }
            ).encode()
            v2_body = header + np.ascontiguousarray(X, dtype="<f8").tobytes()
            v2_seconds, response = _timed(
                lambda: client.post(
                    f"/v2/models/{model_id}/infer",
                    content=v2_body,
                    headers={
                        "content-type": "application/octet-stream",
                        "inference-header-content-length": str(len(header)),
                    },
                ),
                settings.repeats,
            )
            response.raise_for_status()
            length = int(response.headers["inference-header-content-length"])
            from_v2 = np.frombuffer(response.content[length:], dtype="<f8").reshape(n, -1)
    finally:
        server.stop()
    if not (np.array_equal(from_json, from_npy) and np.array_equal(from_npy, from_v2)):
        raise RuntimeError("the three encodings returned different predictions")
    for name, seconds, encode, decode, size, target in (
        (
            "JSON `POST /predict`",
            json_seconds,
            json_encode,
            json_decode,
            len(json_body),
            JSON_BATCH_TARGET_S,
        ),
        (
            ".npy `POST /models/{id}/predict`",
            npy_seconds,
            npy_encode,
            npy_decode,
            len(buffer),
            BINARY_BATCH_TARGET_S,
        ),
        (
            "Open Inference Protocol, binary",
            v2_seconds,
            0.0,
            0.0,
            len(v2_body),
            BINARY_BATCH_TARGET_S,
        ),
    ):
        rows.append(
            [
                name,
                f"{size / 2**20:.1f}",
                f"{seconds:.3f}",
                f"{encode:.3f} / {decode:.3f}",
                f"< {target} s",
            ]
        )
        report.target(
            f"{n:,}-row batch, {name}", f"< {target} s", f"{seconds:.3f} s", seconds < target
        )
    report.add(
        f"### A {n:,}-row batch",
        "",
        f"{n:,} rows of {N_FEATURES} features, k = {N_COMPONENTS}; end to end = from sending "
        "the request (body already encoded) to the whole response received, median of "
        f"{settings.repeats} after a warm-up, on loopback. The client's own encoding of the "
        "body and decoding of the answer are shown apart. The three answers are checked to be "
        "the same numbers, bit for bit.",
        "",
    )
    report.table(
        ["format", "request MiB", "end to end s", "client encode / decode s", "target"], rows
    )


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# --------------------------------------------------------------------------- section 3


def write_upload_files(folder: Path, n_rows: int) -> tuple[Path, Path, int]:
    """The data as a CSV (6 decimals) and a Parquet file (pyarrow's defaults); also returns
    the float64 size of X and y."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pa_parquet

    X, y = make_data(n_rows, seed=DATA_SEED + 2)
    table = pa.table({**{f"x{j}": X[:, j] for j in range(N_FEATURES)}, "y": y})
    csv_path, parquet_path = folder / "upload.csv", folder / "upload.parquet"
    pa_csv.write_csv(table, csv_path)
    pa_parquet.write_table(table, parquet_path)
    return csv_path, parquet_path, X.nbytes + y.nbytes


def run_upload_section(report: Report, settings: Settings, folder: Path) -> None:
    n = settings.upload_rows
    log(f"3) writing {n:,} x {N_FEATURES} as CSV and Parquet")
    csv_path, parquet_path, raw_bytes = write_upload_files(folder, n)
    # Fits run in a probe process (the worker's fit path, measured), not in the server.
    server = mixreg_server(folder, "upload", MIXREG_EMBEDDED_WORKER="false")
    server.start("/healthz")
    database_url = server.env["MIXREG_DATABASE_URL"]
    upload_rows, fit_rows = [], []
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            for label, path, media_type, fits in (
                ("CSV", csv_path, "text/csv", ("auto", "am", "subsample")),
                ("Parquet", parquet_path, "application/vnd.apache.parquet", ("auto",)),
            ):
                log(f"3) uploading the {label} file ({path.stat().st_size / 2**20:.0f} MiB)")
                with measuring(server.pid) as windows, path.open("rb") as file:
                    started = time.perf_counter()
                    response = client.post(
                        "/datasets",
                        files={"file": (path.name, file, media_type)},
                        data={"target": "y", "name": f"bench {label}"},
                    )
                    seconds = time.perf_counter() - started
                response.raise_for_status()
                window = windows[0]
                dataset_id = response.json()["id"]
                ratio = window.extra / raw_bytes
                upload_rows.append(
                    [
                        label,
                        f"{path.stat().st_size / 2**20:.0f}",
                        f"{seconds:.1f}",
                        f"{window.extra / 2**20:.0f}",
                        f"{window.peak / 2**20:.0f}",
                        f"{ratio:.2f}x",
                    ]
                )
                report.target(
                    f"{label} upload, API process peak memory ({n:,} x {N_FEATURES})",
                    f"< {API_MEMORY_TARGET:.0f}x the float64 data",
                    f"{ratio:.2f}x",
                    ratio < API_MEMORY_TARGET,
                )
                for algorithm in fits:
                    log(f"3) {algorithm} fit of the {label} dataset in a probe process")
                    job = client.post(
                        "/fit",
                        json={
                            "dataset_id": dataset_id,
                            "k": N_COMPONENTS,
                            "algorithm": algorithm,
                            "seed": 0,
                        },
                    )
                    job.raise_for_status()
                    job_id = job.json()["job_id"]
                    probe = run_fit_probe(job_id, database_url)
                    finished = client.get(f"/jobs/{job_id}").json()
                    ratio = probe["peak_extra"] / raw_bytes
                    fit_rows.append(
                        [
                            label,
                            f"`{algorithm}`" + (" (default)" if algorithm == "auto" else ""),
                            finished["status"],
                            f"{probe['seconds']:.1f}",
                            f"{probe['peak_extra'] / 2**20:.0f}",
                            f"{probe['peak'] / 2**20:.0f}",
                            f"{ratio:.2f}x",
                        ]
                    )
                    report.target(
                        f"{algorithm} fit of the {label} upload, fit process peak memory",
                        f"< {WORKER_MEMORY_TARGET:.0f}x the float64 data",
                        f"{ratio:.2f}x ({finished['status']})",
                        ratio < WORKER_MEMORY_TARGET and finished["status"] == "succeeded",
                    )
    finally:
        server.stop()
    report.add(
        f"### Uploading {n:,} x {N_FEATURES} and fitting it",
        "",
        f"X and y as float64 take {raw_bytes / 2**20:.0f} MiB. The CSV is written by pyarrow "
        "with 6 decimals, the Parquet file with pyarrow's defaults; each is uploaded as a "
        "multipart file (`curl -F file=@... -F target=y` does the same) to `mixreg serve`. "
        "Peak extra: the API process's resident-set high-water mark during the upload minus "
        "its resident set before (reset through `/proc/<pid>/clear_refs`); peak: the "
        "high-water mark itself.",
        "",
    )
    report.table(
        ["file", "MiB", "upload s", "peak extra MiB", "peak MiB", "peak extra / data"],
        upload_rows,
    )
    report.add(
        "Each fit (k = 4, seed 0) runs the worker's fit path, `service.jobs.training.run_job`, "
        "in a fresh process: read the dataset's chunks from the database into the training "
        "and holdout rows, fit, fit the baseline, store the model. Its peak extra is measured "
        "over the whole job, as above.",
        "",
    )
    report.table(
        ["file", "algorithm", "status", "job s", "peak extra MiB", "peak MiB", "peak extra / data"],
        fit_rows,
    )


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving",
        description="Benchmark predictions and uploads against the real server; write the "
        "serving section of bench/RESULTS.md.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK.load_seconds} s load runs, {QUICK.upload_rows:,}-row uploads",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="Markdown file whose serving section is written (default: bench/RESULTS.md for a "
        "full run; a quick run writes only when this is given)",
    )
    parser.add_argument(
        "--parts",
        default="throughput,batch,uploads",
        help="comma-separated parts to run: throughput (single-row predict), batch (100,000 "
        "rows), uploads (default: all; with fewer, write with --output elsewhere and splice)",
    )
    parser.add_argument("--fit-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = {part.strip() for part in args.parts.split(",")}
    if not parts <= {"throughput", "batch", "uploads"}:
        parser.error(f"--parts: unknown part in {args.parts!r}")
    if args.fit_probe:
        print(json.dumps(fit_probe(json.loads(args.fit_probe))))
        return

    settings = QUICK if args.quick else FULL
    full_run = not args.quick and parts == {"throughput", "batch", "uploads"}
    output = args.output if args.output or not full_run else DEFAULT_OUTPUT
    command = " ".join(["python -m bench.serving", *(sys.argv[1:] if argv is None else argv)])
    started = time.perf_counter()
    body = Report()
    with tempfile.TemporaryDirectory(prefix="mixreg-bench-serving-") as name:
        folder = Path(name)
        if "throughput" in parts:
            run_throughput_section(body, settings, folder)
        if "batch" in parts:
            run_batch_section(body, settings, folder)
        if "uploads" in parts:
            run_upload_section(body, settings, folder)
    elapsed = time.perf_counter() - started
    report = Report()
    report.add("## Serving (issue 8)", "")
    if args.quick:
        report.add("**Quick smoke run: shorter load runs and smaller uploads.**", "")
    report.add("Machine and run:", "", *machine_lines(command, SERVING_PACKAGES), "")
    report.targets_table(body.targets)
    report.add(
        f"Total time: {elapsed / 60:.1f} min; load average at the end: {load_average()}.",
        "",
    )
    report.lines.extend(body.lines)
    if output is not None:
        write_section(output, SECTION, "\n".join(report.lines))
        log(f"wrote the serving section of {output}")


if __name__ == "__main__":
    main()
