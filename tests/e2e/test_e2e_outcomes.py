"""Outcomes joined to the right logged prediction under concurrent requests, over real HTTP to
a uvicorn server, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import mixture_data

THREADS = 8
REQUESTS_PER_THREAD = 40


def _predict_many(base_url: str, model_id: str, seed: int) -> list[tuple[str, np.ndarray]]:
    """Predict requests of 1 to 3 random rows; each answer's request id and predictions."""
    rng = np.random.default_rng(seed)
    answered = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for _ in range(REQUESTS_PER_THREAD):
            X = rng.standard_normal((int(rng.integers(1, 4)), 3))
            response = client.post("/predict", json={"model_id": model_id, "X": X.tolist()})
            assert response.status_code == 200, response.text
            answered.append(
                (response.headers["X-Request-ID"], np.array(response.json()["predictions"]))
            )
    return answered


def _post_when_logged(base_url: str, outcomes: list[dict[str, object]]) -> None:
    """Post ``outcomes``; while their predictions are not written yet (the log is written
    every flush interval), try again."""
    deadline = time.monotonic() + 20
    with httpx.Client(base_url=base_url, timeout=30) as client:
        while True:
            response = client.post("/outcomes", json={"outcomes": outcomes})
            if response.status_code == 201:
                assert response.json() == {"stored": len(outcomes)}
                return
            assert response.status_code == 422, response.text
            assert "not written yet" in response.json()["detail"], response.text
            assert time.monotonic() < deadline, response.text
            time.sleep(0.1)


def test_outcomes_join_the_right_prediction_under_concurrent_requests(make_server):
    server = make_server(
        MIXREG_PREDICTION_LOG_SAMPLE_RATE="1",
        MIXREG_PREDICTION_LOG_FLUSH_INTERVAL_S="0.05",
    )
    X, y = mixture_data()
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "seed": 1})
    )
    assert job["status"] == "succeeded", job
    model_id = job["model_id"]

    with ThreadPoolExecutor(THREADS) as pool:
        batches = list(
            pool.map(lambda seed: _predict_many(server.base_url, model_id, seed), range(THREADS))
        )
    answered = [item for batch in batches for item in batch]
    assert len({request_id for request_id, _ in answered}) == len(answered)

    # Each row's outcome is close to one of its own k values, chosen at random: joined to any
    # other request's row, its min-loss would be far larger.
    rng = np.random.default_rng(7)
    outcomes_by_thread: list[list[dict[str, object]]] = [[] for _ in range(THREADS)]
    offline_losses, offline_best = [], []
    for position, (request_id, predictions) in enumerate(answered):
        for row, values in enumerate(predictions):
            realised = float(values[rng.integers(0, 2)] + rng.uniform(-0.05, 0.05))
            errors = (realised - values) ** 2
            offline_losses.append(errors.min())
            offline_best.append(int(errors.argmin()))
            outcomes_by_thread[position % THREADS].append(
                {"request_id": request_id, "row": row, "y": realised}
            )
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda items: _post_when_logged(server.base_url, items), outcomes_by_thread))

    metrics = server.client.get(
        "/outcomes/metrics", params={"model": model_id, "window": "day", "tolerance": 0.05}
    )
    assert metrics.status_code == 200, metrics.text
    (window,) = metrics.json()["windows"]
    assert window["count"] == len(offline_losses)
    assert window["min_loss"] == pytest.approx(np.mean(offline_losses), rel=1e-9)
    assert window["coverage"] == 1.0
    shares = np.bincount(offline_best, minlength=2) / len(offline_best)
    assert window["best_line_share"] == pytest.approx(shares.tolist(), rel=1e-12)

    # Posting any of them again stores nothing more.
    again = server.client.post("/outcomes", json={"outcomes": outcomes_by_thread[0][:1]})
    assert again.status_code == 422 and "already posted" in again.json()["detail"]
