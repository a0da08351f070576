"""A fit whose dataset takes longer to load than MIXREG_LOAD_TIME_LIMIT_S is stopped by its
worker and its job failed with an error naming the setting; nothing else is lost."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.e2e.conftest import ServerFactory

pytestmark = pytest.mark.e2e


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_a_load_over_the_load_time_limit_ends_the_fit_and_fails_its_job(
    make_server: ServerFactory,
):
    # Starting a fit process and reading 24 MB of rows takes far longer than 10 ms, and the
    # worker looks at its fits every 50 ms: the limit is always over while the load runs.
    server = make_server(MIXREG_LOAD_TIME_LIMIT_S="0.01", MIXREG_WORKER_CONCURRENCY="1")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300_000, 10))
    y = X @ np.arange(1.0, 11.0)
    uploaded = server.request(
        "POST", "/datasets", files={"X": ("X.npy", npy(X)), "y": ("y.npy", npy(y))}
    )
    assert uploaded.status_code == 201, uploaded.text
    dataset_id = uploaded.json()["id"]

    job = server.wait_for_job(
        server.fit({"dataset_id": dataset_id, "k": 1, "algorithm": "am-classic"}), timeout=60
    )

    assert job["status"] == "failed", job
    assert job["attempts"] == 1, job
    assert job["model_id"] is None
    assert "loading the dataset took longer than the load time limit of 0.01 s" in job["error"]
    assert "MIXREG_LOAD_TIME_LIMIT_S" in job["error"]
    # The dataset is kept: a fit with a higher limit can load it.
    assert server.request("GET", f"/datasets/{dataset_id}").json()["n_rows"] == 300_000
