"""Hostile uploads of kept text columns and text keys: small files whose texts would expand to
gigabytes, and a keyed fit on keys of very different lengths.

Each case runs against ``mixreg serve`` with its default settings (a SQLite file in a temporary
folder, the embedded worker), started fresh for this run. For each request: the HTTP status,
the time to the answer, the API process's peak resident-set growth (``VmHWM`` reset through
``/proc/<pid>/clear_refs`` before the request, minus the resident set before it; a small valid
upload of each format goes first, so the libraries a format imports are not counted) and, in the
note, how much the database (with its WAL) grew. The keyed cases also submit ``POST /fit``
with ``split_by`` and wait for the job (the fit runs in the worker's own process).

``python -m bench.hostile_ingest`` prints the rows as a markdown table.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.servers import REPO_ROOT, ServerProcess
from bench.serving import measuring

MB = 1024 * 1024


def wide_npz(n_rows: int = 1000, width: int = 100_000) -> bytes:
    """An ``.npz`` of X, y and a kept array ``g`` of dtype ``<U{width}`` holding one letter per
    row: ``n_rows`` x ``width`` x 4 bytes once decoded, written block by block (never whole)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in (("X", np.ones((n_rows, 1))), ("y", np.arange(n_rows, dtype=float))):
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, array)
        with archive.open("g.npy", "w", force_zip64=True) as member:
            header = {"descr": f"<U{width}", "fortran_order": False, "shape": (n_rows,)}
            np.lib.format.write_array_header_1_0(member, header)
            row = np.zeros(1, dtype=f"<U{width}")
            row[0] = "g"
            block = row.tobytes() * 16
            for _ in range(n_rows // 16):
                member.write(block)
            member.write(row.tobytes() * (n_rows % 16))
    return buffer.getvalue()


def dictionary_parquet(n_rows: int = 200_000, length: int = 5000) -> bytes:
    """A Parquet file of ``n_rows`` rows whose column ``g`` is one ``length``-character text,
    dictionary-encoded: one dictionary entry and ``n_rows`` indices."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "x": np.zeros(n_rows),
            "y": np.ones(n_rows),
            "g": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n_rows, dtype=np.int32)), pa.array(["t" * length])
            ),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def keyed_csv(n_keys: int = 2000, long_key: int = 100_000, rows_per_key: int = 2) -> bytes:
    """A CSV of ``n_keys`` accounts (``acct``), the last one's name ``long_key`` characters."""
    rng = np.random.default_rng(0)
    lines = ["x,y,acct"]
    for key in range(n_keys):
        long = key == n_keys - 1
        name = "a" * long_key if long else f"u{key}"
        for _ in range(rows_per_key if not long or long_key <= 1000 else 1):
            x = rng.integers(0, 100)
            lines.append(f"{x},{2 * x + key % 3},{name}")
    return ("\n".join(lines) + "\n").encode()


class Bench:
    """A fresh ``mixreg serve`` (SQLite, embedded worker) and the measurements of requests."""

    def __init__(self, folder: Path) -> None:
        self.database = folder / "hostile.db"
        mixreg = Path(sys.executable).with_name("mixreg")
        self.server = ServerProcess(
            [str(mixreg), "serve", "--host", "127.0.0.1", "--port", "{port}"],
            env={
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "MIXREG_DATABASE_URL": f"sqlite:///{self.database}",
            },
            log_path=folder / "hostile.log",
        )

    def database_mb(self) -> float:
        paths = [self.database, Path(f"{self.database}-wal")]
        return sum(path.stat().st_size for path in paths if path.exists()) / MB

    def measure(
        self, client: httpx.Client, case: str, size: int, send: Callable[[], httpx.Response]
    ) -> tuple[dict[str, Any], httpx.Response]:
        database_before = self.database_mb()
        with measuring(self.server.pid) as windows:
            began = time.perf_counter()
            response = send()
            seconds = time.perf_counter() - began
        detail = ""
        if response.status_code >= 400:
            detail = str(response.json().get("detail", ""))[:160]
        row: dict[str, Any] = {
            "case": case,
            "request_bytes": size,
            "status": response.status_code,
            "seconds": round(seconds, 3),
            "api_peak_rss_growth_mb": round(windows[0].extra / MB, 1),
            "note": "; ".join(
                part
                for part in (detail, f"DB +{self.database_mb() - database_before:.1f} MB")
                if part
            ),
        }
        return row, response


def upload(
    client: httpx.Client, name: str, body: bytes, media_type: str, **form: str
) -> Callable[[], httpx.Response]:
    return lambda: client.post("/datasets", files={"file": (name, body, media_type)}, data=form)


def wait_for(client: httpx.Client, url: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(url).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not finish within {timeout_s} s")


def keyed_case(bench: Bench, client: httpx.Client, case: str, body: bytes) -> list[dict[str, Any]]:
    """Upload ``body`` keeping ``acct``; if stored, ``POST /fit`` split by it and wait."""
    row, response = bench.measure(
        client,
        f"{case}: upload",
        len(body),
        upload(client, "k.csv", body, "text/csv", target="y", keep="acct"),
    )
    rows = [row]
    if response.status_code != 201:
        return rows
    fit_body = {"dataset_id": response.json()["id"], "k": 2, "split_by": "acct"}
    database_before = bench.database_mb()
    with measuring(bench.server.pid) as windows:
        began = time.perf_counter()
        submitted = client.post("/fit", json=fit_body)
        job = wait_for(client, submitted.json()["url"]) if submitted.status_code == 202 else {}
        seconds = time.perf_counter() - began
    ended = f"job {job.get('status')}" + (f": {job['error'][:160]}" if job.get("error") else "")
    rows.append(
        {
            "case": f"{case}: POST /fit split_by (until the job ends)",
            "request_bytes": len(str(fit_body)),
            "status": submitted.status_code,
            "seconds": round(seconds, 3),
            "api_peak_rss_growth_mb": round(windows[0].extra / MB, 1),
            "note": f"{ended}; DB +{bench.database_mb() - database_before:.1f} MB",
        }
    )
    return rows


def run() -> list[dict[str, object]]:
    """Every case against a fresh server; one row per request."""
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mixreg-hostile-ingest-") as folder:
        bench = Bench(Path(folder))
        bench.server.start("/readyz")
        try:
            with httpx.Client(base_url=bench.server.url, timeout=300) as client:
                # Small valid uploads first: the libraries each format imports on its first
                # upload are not counted as the hostile case's memory.
                for warm_up in (
                    upload(client, "w.npz", wide_npz(10, 4), "application/x-npz", keep="g"),
                    upload(
                        client,
                        "w.parquet",
                        dictionary_parquet(10, 4),
                        "application/vnd.apache.parquet",
                        target="y",
                        keep="g",
                    ),
                    upload(client, "w.csv", keyed_csv(10, 4), "text/csv", target="y", keep="acct"),
                ):
                    assert warm_up().status_code == 201
                npz = wide_npz()
                row, _ = bench.measure(
                    client,
                    ".npz, kept column <U100000 (1,000 rows)",
                    len(npz),
                    upload(client, "d.npz", npz, "application/x-npz", keep="g"),
                )
                rows.append(row)
                parquet = dictionary_parquet()
                row, _ = bench.measure(
                    client,
                    "Parquet, 200,000 rows of one dictionary-encoded 5,000-char text, keep=g",
                    len(parquet),
                    upload(
                        client,
                        "d.parquet",
                        parquet,
                        "application/vnd.apache.parquet",
                        target="y",
                        keep="g",
                    ),
                )
                rows.append(row)
                rows += keyed_case(
                    bench, client, "CSV, 2,000 keys, one of 100,000 chars", keyed_csv()
                )
                rows += keyed_case(
                    bench,
                    client,
                    "CSV, 2,000 keys, one of 1,000 chars",
                    keyed_csv(long_key=1000, rows_per_key=12),
                )
                rows += keyed_case(
                    bench,
                    client,
                    "CSV, 2,000 keys, one of 250 chars",
                    keyed_csv(long_key=250, rows_per_key=12),
                )
        finally:
            bench.server.stop()
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    columns = ["case", "request_bytes", "status", "seconds", "api_peak_rss_growth_mb", "note"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[column]).replace("|", "\\|") for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(run()))
