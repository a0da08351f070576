"""Deleting datasets and the retention of the embedded worker, over real HTTP on SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from sqlalchemy import func, select

from models_store.session import make_engine
from models_store.tables import DatasetChunk

from .conftest import ServerFactory, mixture_data

pytestmark = pytest.mark.e2e


def chunk_count(database_url: str, dataset_id: str) -> int:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            count = connection.scalar(
                select(func.count()).where(DatasetChunk.dataset_id == dataset_id)
            )
            return int(count or 0)
    finally:
        engine.dispose()


def test_a_dataset_a_running_fit_uses_is_kept_then_deleted_with_its_chunks(
    make_server: ServerFactory, database_url: str
):
    server = make_server()
    X, y = mixture_data(n_rows=120)
    stored = server.request("POST", "/datasets", json={"X": X.tolist(), "y": y.tolist()})
    assert stored.status_code == 201, stored.text
    dataset_id = stored.json()["id"]
    job_id = server.fit(
        {
            "dataset_id": dataset_id,
            "k": 2,
            "algorithm": "em",
            "params": {"n_init": 500, "max_iter": 10000, "tol": 0},
            "time_budget_s": 60,
        }
    )
    server.wait_for_job(job_id, until=lambda job: job["status"] == "running")
    assert chunk_count(database_url, dataset_id) > 0
    refused = server.request("DELETE", f"/datasets/{dataset_id}")
    assert refused.status_code == 409
    assert job_id in refused.json()["detail"]
    server.request("POST", f"/jobs/{job_id}/cancel")
    assert server.wait_for_job(job_id)["status"] == "cancelled"
    assert server.request("DELETE", f"/datasets/{dataset_id}").status_code == 204
    assert chunk_count(database_url, dataset_id) == 0
    assert server.request("GET", f"/datasets/{dataset_id}").status_code == 404


def test_the_embedded_worker_expires_finished_jobs_and_discards_data(make_server: ServerFactory):
    # Jobs expire about 3 s after they finish: time enough to see this one succeed first.
    server = make_server(
        MIXREG_JOB_RETENTION_DAYS=str(3 / 86400), MIXREG_RETENTION_INTERVAL_S="0.2"
    )
    X, y = mixture_data(n_rows=60)
    job_id = server.fit(
        {
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "keep_data": False,
        }
    )
    job = server.wait_for_job(job_id)
    assert job["status"] == "succeeded", job
    assert server.request("GET", f"/datasets/{job['dataset_id']}").status_code == 404
    deadline = time.monotonic() + 30
    while server.request("GET", f"/jobs/{job_id}").status_code != 404:
        assert time.monotonic() < deadline, "the finished job was not expired"
        time.sleep(0.1)
    assert server.request("GET", f"/models/{job['model_id']}").status_code == 200


def test_paging_by_cursor_while_another_client_uploads(make_server: ServerFactory):
    server = make_server()
    X, y = mixture_data(n_rows=20)
    body = {"X": X.tolist(), "y": y.tolist()}
    for _ in range(8):
        assert server.request("POST", "/datasets", json=body).status_code == 201
    existing = [item["id"] for item in server.request("GET", "/datasets").json()["items"]]
    stop = threading.Event()

    def upload_until_stopped() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            while not stop.is_set():
                assert client.post("/datasets", json=body).status_code == 201

    uploader = threading.Thread(target=upload_until_stopped)
    uploader.start()
    seen: list[str] = []
    try:
        params: dict[str, str | int] = {"limit": 2}
        while True:
            time.sleep(0.1)  # let uploads land between the pages
            page = server.request("GET", "/datasets", params=params).json()
            seen.extend(item["id"] for item in page["items"])
            if page["next_cursor"] is None:
                break
            params = {"limit": 2, "cursor": page["next_cursor"]}
    finally:
        stop.set()
        uploader.join()
    assert server.request("GET", "/datasets").json()["total"] > len(existing)
    # Uploads before the first page come first; after it, none enters the pages read.
    assert seen[-len(existing) :] == existing
    assert len(seen) == len(set(seen))
