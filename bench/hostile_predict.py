"""Hostile predict bodies against a fresh server: a small ``.npz`` that decompresses to
hundreds of megabytes, and a big JSON body, each with the API process's peak memory growth and
the ``/healthz`` latency seen while it is answered.

Run ``python -m bench.hostile_predict`` (under two minutes): a ``mixreg serve`` subprocess on a
new SQLite file (embedded worker) with one write and one read key; the predicts are sent with
the read key.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.servers import ServerProcess, peak_baseline_bytes, proc_status_bytes
from service.auth.keys import environment_entry, new_key

N_ACCOUNTS = 20
NPZ_ROWS = 5_000_000
NPZ_FEATURES = 10
JSON_ROWS = 75_000
JSON_FEATURES = 20
JSON_SERVED_ROWS = 20_000
HEALTHZ_INTERVAL_S = 0.02


def _server(folder: Path, **settings: str) -> tuple[ServerProcess, dict[str, str]]:
    keys = {scope: new_key(scope=scope) for scope in ("write", "read")}
    mixreg = Path(sys.executable).with_name("mixreg")
    server = ServerProcess(
        [str(mixreg), "serve", "--host", "127.0.0.1", "--port", "{port}"],
        env={
            **os.environ,
            "MIXREG_DATABASE_URL": f"sqlite:///{folder / 'hostile.db'}",
            "MIXREG_API_KEYS": ",".join(environment_entry(key.record) for key in keys.values()),
            **settings,
        },
        log_path=folder / "hostile.log",
    )
    return server, {scope: f"Bearer {key.key}" for scope, key in keys.items()}


def _fit(client: httpx.Client, body: dict[str, object]) -> str:
    """Fit ``body`` and wait for its model id."""
    job_id = client.post("/fit", json=body).raise_for_status().json()["job_id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}").raise_for_status().json()
        if job["status"] == "succeeded":
            model_id: str = job["model_id"]
            return model_id
        if job["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"the bench's fit did not succeed: {job}")
        time.sleep(0.1)
    raise RuntimeError(f"the bench's fit {job_id} did not end within 60 s")


def _keyed_model(client: httpx.Client, n_features: int) -> str:
    """A k = 2 model per account (integer keys) of ``n_features`` features."""
    rng = np.random.default_rng(0)
    n_rows = 40 * N_ACCOUNTS
    X = rng.standard_normal((n_rows, n_features))
    account = np.repeat(np.arange(N_ACCOUNTS), 40)
    y = X[:, 0] * np.where(rng.random(n_rows) < 0.5, 1.0, -1.0) + account
    dataset = client.post(
        "/datasets",
        json={"X": X.tolist(), "y": y.tolist(), "columns": {"account": account.tolist()}},
    ).raise_for_status()
    return _fit(
        client,
        {"dataset_id": dataset.json()["id"], "k": 2, "split_by": "account", "seed": 1},
    )


def _plain_model(client: httpx.Client, n_features: int) -> str:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, n_features))
    y = X[:, 0] * np.where(rng.random(200) < 0.5, 1.0, -1.0)
    body = {"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am-classic"}
    return _fit(client, body)


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _case(
    server: ServerProcess,
    *,
    case: str,
    url: str,
    body: bytes,
    headers: dict[str, str],
    note: str,
) -> dict[str, object]:
    """Post ``body`` while ``/healthz`` is polled; the answer, its time, the API's peak RSS
    growth and the slowest ``/healthz``."""
    healthz: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as prober:
            while not done.is_set():
                sent = time.perf_counter()
                prober.get("/healthz").raise_for_status()
                healthz.append(time.perf_counter() - sent)
                time.sleep(HEALTHZ_INTERVAL_S)

    baseline = peak_baseline_bytes(server.pid)
    prober = threading.Thread(target=poll)
    prober.start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            started = time.perf_counter()
            response = client.post(url, content=body, headers=headers)
            seconds = time.perf_counter() - started
    finally:
        done.set()
        prober.join()
    growth = (proc_status_bytes(server.pid, "VmHWM") - baseline) / 2**20
    detail = ""
    if response.headers.get("content-type") == "application/problem+json":
        detail = "; " + str(response.json()["detail"])[:160]
    return {
        "case": case,
        "request_bytes": len(body),
        "status": response.status_code,
        "seconds": round(seconds, 3),
        "api_peak_rss_growth_mb": round(growth, 1),
        "note": f"{note}; slowest /healthz {max(healthz, default=0.0):.3f} s "
        f"({len(healthz)} probes){detail}",
    }


def run() -> list[dict[str, object]]:
    """The hostile predict cases, one dict each (the bench contract's keys)."""
    with tempfile.TemporaryDirectory(prefix="mixreg-hostile-predict-") as folder:
        server, keys = _server(Path(folder))
        server.start("/healthz")
        try:
            with httpx.Client(
                base_url=server.url, timeout=120, headers={"Authorization": keys["write"]}
            ) as client:
                keyed = _keyed_model(client, NPZ_FEATURES)
                plain = _plain_model(client, JSON_FEATURES)
            read = {"Authorization": keys["read"]}
            npz_headers = {**read, "Content-Type": "application/x-npz"}
            json_headers = {**read, "Content-Type": "application/json"}
            rng = np.random.default_rng(2)
            rows = []
            for n_rows, note in (
                (NPZ_ROWS, "keyed k = 2 model: more rows than MIXREG_MAX_PREDICT_VALUES / k"),
                (2_000_000, "within MIXREG_MAX_PREDICT_VALUES / k, beyond 64 MiB decompressed"),
                (500_000, "within the limits: served"),
            ):
                body = _npz(
                    X=np.zeros((n_rows, NPZ_FEATURES)), keys=np.zeros(n_rows, dtype=np.int64)
                )
                rows.append(
                    _case(
                        server,
                        case=f".npz X zeros {n_rows:,} x {NPZ_FEATURES} + int64 keys",
                        url=f"/predict?model_id={keyed}",
                        body=body,
                        headers=npz_headers,
                        note=f"{note}; read key",
                    )
                )
            for n_rows, note in (
                (JSON_ROWS, "beyond MIXREG_MAX_PREDICT_JSON_BYTES"),
                (JSON_SERVED_ROWS, "just within MIXREG_MAX_PREDICT_JSON_BYTES: served"),
            ):
                X = rng.standard_normal((n_rows, JSON_FEATURES))
                rows.append(
                    _case(
                        server,
                        case=f"JSON body {n_rows:,} x {JSON_FEATURES}",
                        url="/predict",
                        body=json.dumps({"model_id": plain, "X": X.tolist()}).encode(),
                        headers=json_headers,
                        note=f"k = 2 model, {note}; read key",
                    )
                )
            return rows
        finally:
            server.stop()


COLUMNS = ("case", "request_bytes", "status", "seconds", "api_peak_rss_growth_mb", "note")


def main() -> None:
    rows = run()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[column]) for column in COLUMNS) + " |")


if __name__ == "__main__":
    main()
