"""Jobs that nothing loses: kill -9 and restart, cancel, time limit, many fits at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from .conftest import ServerFactory, mixture_data

pytestmark = pytest.mark.e2e


# The long fits below ask for more partitions than the default MIXREG_MAX_N_PARTITIONS.
LONG_FITS_ALLOWED = {"MIXREG_MAX_N_PARTITIONS": str(10**9)}


def long_fit(X: np.ndarray, y: np.ndarray, *, seconds: float | None) -> dict:
    """A sub-sample search with far more partitions than it can try: it runs ``seconds``, or
    for days without a budget (on a server that allows that many, ``LONG_FITS_ALLOWED``)."""
    return {
        "data": {"X": X.tolist(), "y": y.tolist()},
        "k": 2,
        "algorithm": "subsample",
        "params": {"n_partitions": 10**9, "subsample_size": 30},
        "time_budget_s": seconds,
    }


def is_fitting(job: dict) -> bool:
    """Running, and the fit process has reported progress (so it really runs)."""
    return job["status"] == "running" and job["progress"]["fraction"] > 0


def test_a_job_killed_with_the_server_is_retried_after_restart(make_server: ServerFactory):
    server = make_server(**LONG_FITS_ALLOWED)
    X, y = mixture_data(n_rows=120)
    job_id = server.fit(long_fit(X, y, seconds=1.5))
    server.wait_for_job(job_id, is_fitting)

    server.kill()
    server.start()

    job = server.wait_for_job(job_id)
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 2
    model = server.request("GET", job["model_url"]).json()
    assert model["job_id"] == job_id


def test_a_clean_shutdown_queues_the_running_job_again_at_no_cost(make_server: ServerFactory):
    server = make_server(MIXREG_STALE_AFTER_S="600", **LONG_FITS_ALLOWED)
    X, y = mixture_data(n_rows=120)
    job_id = server.fit(long_fit(X, y, seconds=1.5))
    server.wait_for_job(job_id, is_fitting)

    server.stop()
    server.start()

    # Retried at once (not after the 600 s heartbeat timeout), as a first attempt.
    job = server.wait_for_job(job_id, timeout=30)
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 1


def test_a_job_out_of_attempts_fails_as_worker_lost(make_server: ServerFactory):
    server = make_server(MIXREG_MAX_ATTEMPTS="1", **LONG_FITS_ALLOWED)
    X, y = mixture_data(n_rows=120)
    job_id = server.fit(long_fit(X, y, seconds=30))
    server.wait_for_job(job_id, is_fitting)

    server.kill()
    server.start()

    job = server.wait_for_job(job_id)
    assert job["status"] == "failed"
    assert job["attempts"] == 1
    assert job["error"].startswith("worker lost: no heartbeat since ")
    assert job["error"].endswith("gave up after 1 attempts")
    assert job["model_id"] is None


def test_cancel_stops_a_running_fit(make_server: ServerFactory):
    server = make_server(**LONG_FITS_ALLOWED)
    X, y = mixture_data(n_rows=120)
    # A budget far beyond the wait below: the job can only end by being cancelled.
    job_id = server.fit(long_fit(X, y, seconds=3000))
    server.wait_for_job(job_id, is_fitting)

    response = server.request("POST", f"/jobs/{job_id}/cancel")
    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True
    job = server.wait_for_job(job_id, timeout=60)
    assert job["status"] == "cancelled"
    assert job["model_id"] is None

    again = server.request("POST", f"/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert again.json()["detail"] == f"job {job_id} already finished with status cancelled"


def test_a_fit_over_the_time_limit_fails_with_the_reason(make_server: ServerFactory):
    server = make_server(MIXREG_JOB_TIME_LIMIT_S="1.5", **LONG_FITS_ALLOWED)
    X, y = mixture_data(n_rows=120)
    # No budget: only the time limit can end it (a budget must end before the limit).
    job_id = server.fit(long_fit(X, y, seconds=None))

    job = server.wait_for_job(job_id, timeout=20)

    assert job["status"] == "failed"
    assert job["error"] == "time limit of 1.5 s exceeded"
    assert job["attempts"] == 1


def test_twenty_fits_at_once_with_parallel_predicts_on_sqlite(make_sqlite_server: ServerFactory):
    server = make_sqlite_server()
    X, y = mixture_data(n_rows=80)
    small_fit = {
        "data": {"X": X.tolist(), "y": y.tolist()},
        "k": 2,
        "params": {"n_partitions": 50, "subsample_size": 20, "max_iter": 20},
    }
    first = server.wait_for_job(server.fit(small_fit))
    model_id = first["model_id"]

    def submit(seed: int) -> int:
        return server.client.post("/fit", json={**small_fit, "seed": seed}).status_code

    def predict(_: int) -> int:
        return server.client.post(
            "/predict", json={"model_id": model_id, "X": X[:10].tolist()}
        ).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        submitted = pool.map(submit, range(20))
        predicted = pool.map(predict, range(40))
        assert list(submitted) == [202] * 20
        assert list(predicted) == [200] * 40

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page = server.request("GET", "/jobs", params={"limit": 100}).json()
        statuses = [job["status"] for job in page["items"]]
        if all(status in ("succeeded", "failed", "cancelled") for status in statuses):
            break
        time.sleep(0.2)
    assert page["total"] == 21
    assert statuses == ["succeeded"] * 21, page
    assert "database is locked" not in server.log()
    assert server.request("GET", "/models").json()["total"] == 21
