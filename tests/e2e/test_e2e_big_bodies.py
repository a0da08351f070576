"""Big request bodies do not hold up small requests: a big JSON dataset, or a fit with big
inline data, is parsed off the event loop while single-row predictions keep being answered."""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import Server, ServerFactory

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


def predicts_during(server: Server, model_id: str, path: str, body: bytes):
    """Single-row prediction latencies before (50 of them) and while ``body`` is posted to
    ``path``; the big request's answer and how long it took."""
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        baseline = predict_latencies(client, model_id, until=None, n=50)
        posted = threading.Event()
        answers: list[httpx.Response] = []

        def post() -> None:
            with httpx.Client(base_url=server.base_url, timeout=120) as poster:
                answers.append(
                    poster.post(path, content=body, headers={"content-type": "application/json"})
                )
            posted.set()

        poster = threading.Thread(target=post)
        started = time.monotonic()
        poster.start()
        during = predict_latencies(client, model_id, until=posted, n=0)
        poster.join()
        post_seconds = time.monotonic() - started
    (answer,) = answers
    return baseline, during, answer, post_seconds


def assert_no_predict_waited(baseline, during, post_seconds) -> None:
    # Loosely, as the machine may be busy: no prediction waited for the parse, which is most of
    # the post's time; the longest wait is jitter, small beside the post and beside what
    # single-row predictions take anyway.
    typical = statistics.median(baseline)
    longest = max(during)
    assert longest < max(1.0, 20 * typical, 0.3 * post_seconds), (
        longest,
        typical,
        post_seconds,
    )


def small_model(server: Server, rng: np.random.Generator) -> str:
    X = rng.standard_normal((40, 1))
    job = server.wait_for_job(
        server.fit({"data": {"X": X.tolist(), "y": X[:, 0].tolist()}, "k": 2})
    )
    model_id: str = job["model_id"]
    return model_id


def test_single_row_predicts_answer_while_a_big_json_dataset_is_parsed(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rng = np.random.default_rng(0)
    model_id = small_model(server, rng)
    # About 40 MB of JSON: seconds of parsing.
    big_X = rng.standard_normal((300_000, 5))
    big_body = json.dumps({"X": big_X.tolist(), "y": big_X[:, 0].tolist()}).encode()

    baseline, during, answer, post_seconds = predicts_during(
        server, model_id, "/datasets", big_body
    )

    assert answer.status_code == 201, answer.text
    assert answer.json()["n_rows"] == 300_000
    assert_no_predict_waited(baseline, during, post_seconds)


def test_single_row_predicts_answer_while_a_fit_with_big_inline_data_is_parsed(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rng = np.random.default_rng(1)
    model_id = small_model(server, rng)
    big_X = rng.standard_normal((300_000, 5))
    big_y = big_X @ np.arange(1.0, 6.0)
    big_body = json.dumps(
        {
            "data": {"X": big_X.tolist(), "y": big_y.tolist()},
            "k": 1,
            "algorithm": "am-classic",
            "holdout_fraction": 0,
        }
    ).encode()

    baseline, during, answer, post_seconds = predicts_during(server, model_id, "/fit", big_body)

    assert answer.status_code == 202, answer.text
    assert_no_predict_waited(baseline, during, post_seconds)
    # The inline rows were stored and fitted as sent.
    job = server.wait_for_job(answer.json()["job_id"], timeout=120)
    assert job["status"] == "succeeded", job
    dataset = server.request("GET", f"/datasets/{job['dataset_id']}").json()
    assert (dataset["n_rows"], dataset["n_features"]) == (300_000, 5)
    model = server.request("GET", f"/models/{job['model_id']}").json()
    np.testing.assert_allclose(model["components"][0]["coef"], np.arange(1.0, 6.0), atol=1e-9)


def test_a_big_fit_body_that_does_not_validate_is_a_422_naming_the_field(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    rows = [[0.5, 1.5]] * 20_000
    body = {"data": {"X": rows, "y": [1.0] * 19_999}, "k": 2}
    answer = server.request("POST", "/fit", json=body)
    assert answer.status_code == 422, answer.text
    assert "y has 19999 values but X has 20000 rows" in answer.json()["detail"]
    body = {"data": {"X": rows, "y": [1.0] * 20_000}, "k": 0}
    answer = server.request("POST", "/fit", json=body)
    assert answer.status_code == 422, answer.text
    assert [error["loc"] for error in answer.json()["errors"]] == [["body", "k"]]
