"""Hostile inputs: the processes that parse big JSON bodies, killed.

A server started fresh (SQLite, embedded worker) takes a JSON dataset over 64 KiB (parsed in a
child process); the child is then killed with SIGKILL, as the kernel's OOM killer does, and the
next such upload is timed, with ``/readyz`` while the pool is broken; then a child is killed while
it parses a 12 MB body. Each row: the request's size, the answer's status, its time and the API
process's peak RSS growth during it (``VmHWM`` after minus ``VmRSS`` before, the high-water mark
reset first through ``/proc/<pid>/clear_refs`` where the kernel allows it).

    python -m bench.hostile_parser
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from bench.keyed_workers import descendants
from bench.servers import ServerProcess, peak_baseline_bytes, proc_status_bytes
from bench.serving import mixreg_server

JSON = {"content-type": "application/json"}


def _json_dataset(n_rows: int, seed: int) -> bytes:
    X = np.random.default_rng(seed).standard_normal((n_rows, 3))
    return json.dumps({"X": X.tolist(), "y": X[:, 0].tolist()}).encode()


def _measured(
    server: ServerProcess, case: str, request_bytes: int, send: Callable[[], httpx.Response]
) -> tuple[dict[str, object], httpx.Response]:
    before = peak_baseline_bytes(server.pid)
    started = time.perf_counter()
    answer = send()
    seconds = time.perf_counter() - started
    growth = max(0, proc_status_bytes(server.pid, "VmHWM") - before) / 2**20
    detail = ""
    if answer.headers.get("content-type") == "application/problem+json":
        detail = str(answer.json().get("detail", ""))
    retry_after = answer.headers.get("retry-after")
    note = (f"Retry-After {retry_after}; " if retry_after else "") + detail[:110]
    row: dict[str, object] = {
        "case": case,
        "request_bytes": request_bytes,
        "status": answer.status_code,
        "seconds": round(seconds, 3),
        "api_peak_rss_growth_mb": round(growth, 1),
        "note": note,
    }
    return row, answer


def _parser_children(server: ServerProcess) -> set[int]:
    # No fit runs here: the fork server's children, two levels down, are the parsers.
    return set(descendants(server.pid, min_depth=2))


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def run() -> list[dict[str, object]]:
    """The cases, on a server of their own."""
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as folder:
        server = mixreg_server(Path(folder), "hostile-parser")
        server.start()
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                body = _json_dataset(5_000, seed=0)

                def upload(content: bytes = body) -> httpx.Response:
                    return client.post("/datasets", content=content, headers=JSON)

                row, _ = _measured(
                    server,
                    "JSON upload > 64 KiB, parsers healthy (their cold start)",
                    len(body),
                    upload,
                )
                rows.append(row)

                for child in _parser_children(server):
                    os.kill(child, signal.SIGKILL)
                time.sleep(0.2)
                row, _ = _measured(
                    server,
                    "GET /readyz after SIGKILL of the idle parsers",
                    0,
                    lambda: client.get("/readyz"),
                )
                rows.append(row)
                row, _ = _measured(
                    server, "next JSON upload > 64 KiB after the kill", len(body), upload
                )
                rows.append(row)

                for child in _parser_children(server):
                    os.kill(child, signal.SIGKILL)
                time.sleep(0.2)
                row, _ = _measured(
                    server,
                    "JSON upload > 64 KiB right after a 2nd kill (no probe)",
                    len(body),
                    upload,
                )
                rows.append(row)

                rows.append(_killed_while_parsing(server, upload))
                row, _ = _measured(
                    server, "next JSON upload > 64 KiB after that", len(body), upload
                )
                rows.append(row)
                row, _ = _measured(
                    server, "GET /readyz after the recovery", 0, lambda: client.get("/readyz")
                )
                rows.append(row)
        finally:
            server.stop()
    return rows


def _killed_while_parsing(
    server: ServerProcess, upload: Callable[[bytes], httpx.Response]
) -> dict[str, object]:
    """A 12 MB body whose parsing child is killed once it has worked 0.2 s on it."""
    big = _json_dataset(150_000, seed=1)
    idle = {child: _cpu_ticks(child) for child in _parser_children(server)}
    rows: list[dict[str, object]] = []

    def post() -> None:
        row, _ = _measured(
            server,
            "12 MB JSON upload, its parser SIGKILLed mid-parse",
            len(big),
            lambda: upload(big),
        )
        rows.append(row)

    poster = threading.Thread(target=post)
    poster.start()
    deadline = time.monotonic() + 30
    while poster.is_alive() and time.monotonic() < deadline:
        busy = [
            child
            for child in _parser_children(server)
            if child not in idle or _cpu_ticks(child) > idle[child] + 20
        ]
        if busy:
            for child in busy:
                os.kill(child, signal.SIGKILL)
            break
        time.sleep(0.05)
    poster.join()
    (row,) = rows
    row["note"] = f"(the time includes the upload and 0.2 s of parsing) {row['note']}"
    return row


def _table(rows: list[dict[str, object]]) -> str:
    keys = ["case", "request_bytes", "status", "seconds", "api_peak_rss_growth_mb", "note"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[key]) for key in keys) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(_table(run()))
