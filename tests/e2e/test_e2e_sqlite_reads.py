"""On a SQLite file, reads (alias lookups of predictions too) answer while another process holds
the write lock."""

from __future__ import annotations

import sqlite3
import time

import httpx
import numpy as np
import pytest
from sqlalchemy import make_url

from tests.e2e.conftest import ServerFactory

pytestmark = pytest.mark.e2e


def test_a_long_held_write_does_not_block_reads(make_sqlite_server: ServerFactory, sqlite_url):
    server = make_sqlite_server()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 1))
    created = server.request("POST", "/datasets", json={"X": X.tolist(), "y": X[:, 0].tolist()})
    assert created.status_code == 201, created.text
    job = server.wait_for_job(
        server.fit({"dataset_id": created.json()["id"], "k": 2, "registered_model": "reco"})
    )
    assert job["status"] == "succeeded"
    moved = server.request("PUT", "/registered-models/reco/aliases/production", json={"version": 1})
    assert moved.status_code == 200, moved.text

    # The server's own writes (its worker's heartbeats, retention) take the lock for moments:
    # wait for them, then hold it.
    writer = sqlite3.connect(make_url(sqlite_url).database, timeout=30, isolation_level=None)
    try:
        # Another process (an upload, a worker's write) holds the write lock for seconds.
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE jobs SET name = 'renamed'")
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            for path in (
                "/jobs?limit=5",
                f"/jobs/{job['id']}",
                "/models",
                f"/models/{job['model_id']}",
                "/datasets",
                "/ui",
            ):
                sent = time.monotonic()
                response = client.get(path)
                assert response.status_code == 200, (path, response.text)
                # Answered from the last committed state, without waiting for the lock.
                assert time.monotonic() - sent < 5, path
            assert client.get(f"/jobs/{job['id']}").json()["name"] is None
            # A prediction by alias looks the alias up (not yet remembered): a pure read too.
            sent = time.monotonic()
            answer = client.post("/predict", json={"model_id": "reco@production", "X": [[0.5]]})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model_id"] == job["model_id"]
            assert time.monotonic() - sent < 5
    finally:
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
