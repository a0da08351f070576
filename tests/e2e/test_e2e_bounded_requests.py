"""What a request computes before it answers is bounded: a fit whose parameters are costly to
resolve is answered (never a 5xx, never a request stuck for good) while the server keeps
answering everyone else."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import ServerFactory

pytestmark = pytest.mark.e2e

# The resolution is one pass of milliseconds in the request's thread; loosely, for a busy
# machine: what a costly request may take at most.
ANSWER_WITHIN_S = 10.0


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"subsample_size": 1500}, id="deep-partition-count"),
        pytest.param({"subsample_size": 5000}, id="deeper-partition-count"),
        pytest.param({}, id="default-size-for-one-line"),
    ],
)
def test_a_costly_exhaustive_fit_is_answered_while_others_are_served(
    make_sqlite_server: ServerFactory, params
):
    server = make_sqlite_server()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 1))
    created = server.request(
        "POST", "/datasets", json={"X": X.tolist(), "y": (3 * X[:, 0]).tolist()}
    )
    assert created.status_code == 201, created.text
    dataset_id = created.json()["id"]

    answers: list[httpx.Response] = []

    def costly_fit() -> None:
        with httpx.Client(base_url=server.base_url, timeout=ANSWER_WITHIN_S + 30) as client:
            body = {
                "dataset_id": dataset_id,
                "k": 1 if not params else 2,
                "algorithm": "subsample-exhaustive",
                "params": params,
            }
            answers.append(client.post("/fit", json=body))

    started = time.monotonic()
    costly = threading.Thread(target=costly_fit)
    costly.start()
    others: list[tuple[int, float]] = []
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        # At least one round, then as long as the costly request is in flight.
        while not others or (costly.is_alive() and time.monotonic() - started < ANSWER_WITHIN_S):
            for method, path, body in (
                ("GET", "/jobs?limit=5", None),
                ("POST", "/fit", {"dataset_id": dataset_id, "k": 2, "algorithm": "am"}),
            ):
                sent = time.monotonic()
                response = client.request(method, path, json=body)
                others.append((response.status_code, time.monotonic() - sent))
            time.sleep(0.05)
    costly.join(timeout=ANSWER_WITHIN_S)
    assert not costly.is_alive(), "the costly fit request got no answer"
    assert time.monotonic() - started < ANSWER_WITHIN_S + 10

    (answer,) = answers
    assert answer.status_code in (202, 422), answer.text
    if answer.status_code == 422:
        problem = answer.json()
        assert "subsample-exhaustive" in problem["detail"]
        assert "subsample_size" in problem["detail"]
    assert {status for status, _ in others} <= {200, 202}, others
    # Answered, not queued behind the costly request (which may take seconds).
    assert max(seconds for _, seconds in others) < 10
