"""Big request bodies do not hold up small requests: a big JSON dataset is parsed off the
event loop while single-row predictions keep being answered."""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import ServerFactory

pytestmark = pytest.mark.e2e


def predict_latencies(
    client: httpx.Client, model_id: str, *, until: threading.Event | None, n: int
):
    """Seconds taken by single-row predictions sent one after the other: ``n`` of them, or
    until ``until`` is set."""
    seconds = []
    while (until is None and len(seconds) < n) or (until is not None and not until.is_set()):
        sent = time.monotonic()
        response = client.post("/predict", json={"model_id": model_id, "X": [[0.5]]})
        seconds.append(time.monotonic() - sent)
        assert response.status_code == 200, response.text
    return seconds


def test_single_row_predicts_answer_while_a_big_json_dataset_is_parsed(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 1))
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": X[:, 0].tolist()}, "k": 2})
    )
    model_id = job["model_id"]
    # About 40 MB of JSON: seconds of parsing.
    big_X = rng.standard_normal((300_000, 5))
    big_body = json.dumps({"X": big_X.tolist(), "y": big_X[:, 0].tolist()}).encode()

    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        baseline = predict_latencies(client, model_id, until=None, n=50)
        uploaded = threading.Event()
        answers: list[httpx.Response] = []

        def upload() -> None:
            with httpx.Client(base_url=server.base_url, timeout=120) as uploader:
                answers.append(
                    uploader.post(
                        "/datasets", content=big_body, headers={"content-type": "application/json"}
                    )
                )
            uploaded.set()

        uploader = threading.Thread(target=upload)
        started = time.monotonic()
        uploader.start()
        during = predict_latencies(client, model_id, until=uploaded, n=0)
        uploader.join()
        upload_seconds = time.monotonic() - started

    (answer,) = answers
    assert answer.status_code == 201, answer.text
    assert answer.json()["n_rows"] == 300_000
    # Loosely, as the machine may be busy: no prediction waited for the parse, which is most of
    # the upload's time; the longest wait is jitter, small beside the upload and beside what
    # single-row predictions take anyway.
    typical = statistics.median(baseline)
    longest = max(during)
    assert longest < max(1.0, 20 * typical, 0.3 * upload_seconds), (
        longest,
        typical,
        upload_seconds,
    )
