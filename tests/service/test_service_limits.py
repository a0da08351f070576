"""Limits on everything a request can make expensive, each refused with a 4xx naming its
setting; unfinished jobs per key (429); the same problem for an unparsable body on every
endpoint; idempotent uploads; the start-up line without keys; who may read /metrics."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from models_store.session import session_scope
from models_store.tables import Dataset, Job, Model
from service.auth.keys import environment_entry, new_key
from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL
from tests.service.test_service_api_bad_input import NO_ROWS, assert_problem

GOOD_X = [[0.0, 1.0], [1.0, 0.5], [2.0, -1.0], [3.0, 2.0], [4.0, 0.0], [5.0, 1.5]]
GOOD_Y = [1.0, 2.0, 0.5, 3.0, -1.0, 0.0]

SMALL_LIMITS = {
    "max_rows": 30,
    "max_features": 3,
    "max_k": 3,
    "max_n_partitions": 1000,
    "max_subsample_size": 150,
    "max_iterations": 200,
    "max_n_init": 4,
    "max_time_budget_s": 5.0,
    "max_k_sweep": 2,
}


def count_rows(client: TestClient) -> dict[str, int]:
    """Rows of every table of the database ``client``'s app uses."""
    with session_scope(client.app.state.session_factory) as session:  # type: ignore[attr-defined]
        return {
            table.__tablename__: session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Dataset, Job, Model)
        }


@pytest.fixture
def limited(sqlite_url):
    settings = Settings(database_url=sqlite_url, embedded_worker=False, **SMALL_LIMITS)
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        yield client


def fit(**overrides):
    return {"data": {"X": GOOD_X, "y": GOOD_Y}, "k": 2, **overrides}


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        (fit(k=4), 422, "k = 4 is above the limit of 3 (MIXREG_MAX_K)"),
        (fit(k=[1, 5]), 422, "k[1] = 5 is above the limit of 3 (MIXREG_MAX_K)"),
        (
            fit(k=[1, 2, 3]),
            422,
            "k lists 3 values; a sweep fits at most 2 (MIXREG_MAX_K_SWEEP); split it into "
            "several jobs",
        ),
        (
            fit(algorithm="subsample", params={"n_partitions": 1001, "subsample_size": 151}),
            422,
            "params.n_partitions = 1001 is above the limit of 1000 (MIXREG_MAX_N_PARTITIONS); "
            "params.subsample_size = 151 is above the limit of 150 (MIXREG_MAX_SUBSAMPLE_SIZE)",
        ),
        (
            fit(algorithm="em", params={"max_iter": 201, "n_init": 5}),
            422,
            "params.max_iter = 201 is above the limit of 200 (MIXREG_MAX_ITERATIONS); "
            "params.n_init = 5 is above the limit of 4 (MIXREG_MAX_N_INIT)",
        ),
        (
            fit(time_budget_s=5.5),
            422,
            "time_budget_s = 5.5 is above the limit of 5 (MIXREG_MAX_TIME_BUDGET_S)",
        ),
        (
            fit(data={"X": [[float(i), 1.0] for i in range(31)], "y": [1.0] * 31}),
            413,
            "data.X has 31 rows; at most 30 are accepted (MIXREG_MAX_ROWS)",
        ),
        (
            fit(data={"X": [[1.0, 2.0, 3.0, 4.0]] * 6, "y": GOOD_Y}),
            413,
            "data.X has 4 features; at most 3 are accepted (MIXREG_MAX_FEATURES)",
        ),
    ],
    ids=["k", "k-in-a-sweep", "sweep", "partitions", "iterations", "budget", "rows", "features"],
)
def test_a_fit_over_a_limit_is_refused_naming_the_setting(limited, body, status, detail):
    response = assert_problem(limited.post("/fit", json=body), status, detail)
    assert response["type"] == "urn:mixreg:problem:limit-exceeded"
    assert count_rows(limited) == NO_ROWS


def test_each_parameter_over_its_limit_is_listed_with_its_location(limited):
    body = assert_problem(
        limited.post("/fit", json=fit(k=4, time_budget_s=6)),
        422,
        "k = 4 is above the limit of 3 (MIXREG_MAX_K); "
        "time_budget_s = 6 is above the limit of 5 (MIXREG_MAX_TIME_BUDGET_S)",
    )
    assert [error["loc"] for error in body["errors"]] == [["body", "k"], ["body", "time_budget_s"]]


def test_predictions_and_uploads_over_the_row_limit_are_413(limited):
    rows = [[float(i), 1.0] for i in range(31)]
    response = limited.post("/predict", json={"model_id": "a" * 32, "X": rows})
    assert_problem(response, 413, "X has 31 rows; at most 30 are accepted (MIXREG_MAX_ROWS)")
    response = limited.post("/datasets", json={"X": rows, "y": [1.0] * 31})
    assert response.status_code == 413, response.text
    assert "MIXREG_MAX_ROWS" in response.json()["detail"]
    assert count_rows(limited) == NO_ROWS


@pytest.fixture
def default_limits(sqlite_url):
    settings = Settings(database_url=sqlite_url, embedded_worker=False)
    with TestClient(create_app(settings), base_url=LOCAL_URL) as c:
        yield c


def test_a_ten_thousand_column_csv_is_refused(default_limits):
    header = ",".join(f"c{index}" for index in range(10_000)) + ",y\n"
    row = ",".join("1" for _ in range(10_001)) + "\n"
    response = default_limits.post(
        "/datasets",
        params={"target": "y"},
        content=(header + row * 3).encode(),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 413, response.text
    assert "MIXREG_MAX_FEATURES" in response.json()["detail"]
    assert count_rows(default_limits) == NO_ROWS


def test_a_ten_megabyte_name_is_refused_and_pages_stay_small(default_limits):
    huge = "n" * 10_000_000
    response = default_limits.post("/fit", json=fit(name=huge))
    assert_problem(response, 422, "name: String should have at most 256 characters")
    response = default_limits.post("/datasets", json={"X": GOOD_X, "y": GOOD_Y, "name": huge})
    assert_problem(response, 422, "name: String should have at most 256 characters")
    response = default_limits.post(
        "/datasets",
        files={"file": ("d.csv", b"a,y\n1,2\n3,4\n", "text/csv")},
        data={"target": "y", "name": "n" * 257},
    )
    assert_problem(response, 422, "name has 257 characters; a name may have at most 256")
    response = default_limits.post(
        "/datasets",
        params={"target": "y", "name": "n" * 257},
        content=b"a,y\n1,2\n",
        headers={"content-type": "text/csv"},
    )
    assert_problem(response, 422, "name: String should have at most 256 characters")
    long_column = "c" * 300
    response = default_limits.post(
        "/datasets",
        params={"target": "y"},
        content=f"{long_column},y\n1,2\n".encode(),
        headers={"content-type": "text/csv"},
    )
    assert_problem(
        response, 422, "feature_names[0] has 300 characters; a name may have at most 256"
    )
    response = default_limits.post("/predict", json={"model_id": "m" * 10_000, "X": [[1.0, 2.0]]})
    assert_problem(response, 422, "model_id: String should have at most 256 characters")
    assert count_rows(default_limits) == NO_ROWS
    assert len(default_limits.get("/jobs").content) < 1000


# --- unfinished jobs per key ---


def test_each_key_may_have_a_limited_number_of_unfinished_jobs(sqlite_url):
    first, second = new_key(scope="write"), new_key(scope="write")
    settings = Settings(
        database_url=sqlite_url,
        embedded_worker=False,  # the jobs stay queued
        max_queued_jobs_per_key=2,
        api_keys=f"{environment_entry(first.record)},{environment_entry(second.record)}",
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        as_first = {"Authorization": f"Bearer {first.key}"}
        retry = {**as_first, "Idempotency-Key": "first-fit"}
        assert client.post("/fit", json=fit(), headers=retry).status_code == 202
        assert client.post("/fit", json=fit(), headers=as_first).status_code == 202
        refused = client.post("/fit", json=fit(), headers=as_first)
        assert_problem(
            refused,
            429,
            f"API key {first.record.id} has 2 jobs queued or running, the most allowed "
            f"(MIXREG_MAX_QUEUED_JOBS_PER_KEY = 2); retry once some have finished",
        )
        assert int(refused.headers["retry-after"]) >= 1
        # A retry of an accepted submission is still answered; another key is not held back.
        replay = client.post("/fit", json=fit(), headers=retry)
        assert (replay.status_code, replay.headers["idempotent-replayed"]) == (202, "true")
        as_second = {"Authorization": f"Bearer {second.key}"}
        assert client.post("/fit", json=fit(), headers=as_second).status_code == 202
        # A finished (here: cancelled) job frees its place.
        cancelled = client.post(f"/jobs/{replay.json()['job_id']}/cancel", headers=as_first)
        assert cancelled.status_code == 202
        assert client.post("/fit", json=fit(), headers=as_first).status_code == 202
        assert client.get("/jobs", headers=as_first).json()["total"] == 4


def test_without_keys_all_unfinished_jobs_count_together(sqlite_url):
    settings = Settings(database_url=sqlite_url, embedded_worker=False, max_queued_jobs_per_key=1)
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        assert client.post("/fit", json=fit()).status_code == 202
        assert_problem(
            client.post("/fit", json=fit()),
            429,
            "this server has 1 jobs queued or running, the most allowed "
            "(MIXREG_MAX_QUEUED_JOBS_PER_KEY = 1); retry once some have finished",
        )


# --- bodies that cannot be parsed: one problem on every endpoint ---

UNPARSABLE = {
    "invalid-utf-8": (
        b'{"X": [[1.0]], "name": "\xff\xfe"}',
        "request body is not valid JSON: invalid unicode code point at line 1 column 25",
    ),
    "arrays-100000-deep": (
        b"[" * 100_000 + b"]" * 100_000,
        "request body is not valid JSON: recursion limit exceeded at line 1 column 202",
    ),
    "objects-100000-deep": (
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "request body is not valid JSON: recursion limit exceeded at line 1 column 1006",
    ),
    "truncated": (
        b'{"k": 2,',
        "request body is not valid JSON: EOF while parsing a value at line 1 column 8",
    ),
}


@pytest.mark.parametrize("case", sorted(UNPARSABLE))
def test_an_unparsable_body_is_the_same_problem_on_every_endpoint(default_limits, case):
    raw, detail = UNPARSABLE[case]
    for path in ("/fit", "/predict", "/datasets", f"/models/{'a' * 32}/predict"):
        response = default_limits.post(
            path, content=raw, headers={"content-type": "application/json"}
        )
        body = assert_problem(response, 422, detail)
        assert body["type"] == "urn:mixreg:problem:validation-error"


# --- Idempotency-Key on uploads ---


def test_an_upload_retried_with_its_idempotency_key_is_stored_once(default_limits):
    key = {"Idempotency-Key": "upload-1"}
    first = default_limits.post("/datasets", json={"X": GOOD_X, "y": GOOD_Y}, headers=key)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = default_limits.post("/datasets", json={"X": GOOD_X, "y": GOOD_Y}, headers=key)
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    # The same rows and names as an NPZ file are the same upload.
    archive = io.BytesIO()
    np.savez(archive, X=np.array(GOOD_X), y=np.array(GOOD_Y))
    as_file = default_limits.post(
        "/datasets", files={"file": ("d.npz", archive.getvalue())}, headers=key
    )
    assert (as_file.status_code, as_file.json()["id"]) == (201, first.json()["id"])
    other = default_limits.post("/datasets", json={"X": GOOD_X, "y": GOOD_Y[::-1]}, headers=key)
    assert_problem(
        other,
        409,
        f"Idempotency-Key 'upload-1' was already used for a different upload (dataset "
        f"{first.json()['id']}); use a new key for a new upload",
    )
    assert count_rows(default_limits)["datasets"] == 1
    fresh = default_limits.post(
        "/datasets", json={"X": GOOD_X, "y": GOOD_Y}, headers={"Idempotency-Key": "upload-2"}
    )
    assert fresh.json()["id"] != first.json()["id"]


# --- start-up line, /metrics ---


def test_without_keys_the_start_up_log_says_the_api_is_unauthenticated(sqlite_url, caplog):
    settings = Settings(database_url=sqlite_url, embedded_worker=False)
    with (
        caplog.at_level(logging.WARNING, logger="service.main"),
        TestClient(create_app(settings), base_url=LOCAL_URL),
    ):
        pass
    assert any(
        "the API is UNAUTHENTICATED and answers clients on this machine (loopback) only"
        in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize("require_key", [True, False])
def test_metrics_need_a_key_unless_the_setting_opens_them(sqlite_url, require_key):
    reader = new_key(scope="read")
    settings = Settings(
        database_url=sqlite_url,
        embedded_worker=False,
        api_keys=environment_entry(reader.record),
        metrics_require_key=require_key,
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        anonymous = client.get("/metrics")
        assert anonymous.status_code == (401 if require_key else 200)
        keyed = client.get("/metrics", headers={"Authorization": f"Bearer {reader.key}"})
        assert keyed.status_code == 200
        assert "mixreg" in keyed.text
