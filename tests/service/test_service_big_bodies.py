"""Big JSON bodies, validated in a child process, are answered as small ones are."""

from __future__ import annotations

import numpy as np

from service.data.json_bodies import PARSE_IN_A_CHILD_BYTES


def big_rows(n_rows: int = 6000) -> tuple[list[list[float]], list[float]]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n_rows, 2))
    return X.tolist(), (X[:, 0] - X[:, 1]).tolist()


def test_a_big_inline_fit_is_queued_with_all_its_rows(client):
    X, y = big_rows()
    body = {"data": {"X": X, "y": y}, "k": 2, "algorithm": "am"}
    response = client.post("/fit", json=body)
    assert len(response.request.content) > PARSE_IN_A_CHILD_BYTES
    assert response.status_code == 202, response.text
    job = client.get(response.json()["url"]).json()
    dataset = client.get(f"/datasets/{job['dataset_id']}").json()
    assert (dataset["n_rows"], dataset["n_features"]) == (6000, 2)


def test_a_big_invalid_fit_body_gets_the_problem_a_small_one_gets(client):
    X, y = big_rows()
    X[5000] = [1.0]
    response = client.post("/fit", json={"data": {"X": X, "y": y}, "k": 2})
    assert len(response.request.content) > PARSE_IN_A_CHILD_BYTES
    small = client.post("/fit", json={"data": {"X": [[1.0, 2.0], [1.0]], "y": [1.0, 2.0]}, "k": 2})
    assert (response.status_code, small.status_code) == (422, 422)
    assert response.json()["title"] == small.json()["title"]


def test_a_big_inline_fit_with_a_bad_value_names_it(client):
    X, y = big_rows()
    X[4321] = [1e308, 1e308]
    response = client.post("/fit", json={"data": {"X": X, "y": y}, "k": 2})
    assert len(response.request.content) > PARSE_IN_A_CHILD_BYTES
    assert response.status_code == 422, response.text
    assert "4321" in response.json()["detail"]


def test_a_big_inline_fit_retried_with_its_key_is_the_same_job(client):
    X, y = big_rows()
    body = {"data": {"X": X, "y": y}, "k": 2, "algorithm": "am"}
    headers = {"Idempotency-Key": "big-inline"}
    first = client.post("/fit", json=body, headers=headers)
    again = client.post("/fit", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (202, 202), again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["job_id"] == first.json()["job_id"]
    y[0] += 1.0
    changed = client.post("/fit", json=body, headers=headers)
    assert changed.status_code == 409, changed.text


def test_a_big_json_dataset_is_stored_with_all_its_rows(client):
    X, y = big_rows()
    response = client.post("/datasets", json={"X": X, "y": y, "name": "big"})
    assert len(response.request.content) > PARSE_IN_A_CHILD_BYTES
    assert response.status_code == 201, response.text
    assert (response.json()["n_rows"], response.json()["name"]) == (6000, "big")


def test_a_big_json_dataset_with_a_bad_value_names_it(client):
    X, y = big_rows()
    y[4321] = 1e308
    X[4321] = [1e308, 1e308]
    response = client.post("/datasets", json={"X": X, "y": y})
    assert len(response.request.content) > PARSE_IN_A_CHILD_BYTES
    assert response.status_code == 422, response.text
    assert "4321" in response.json()["detail"]
