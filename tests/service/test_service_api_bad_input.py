"""Every malformed request gets a 4xx problem+json naming the field, row or column — and
writes nothing."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models_store import datasets as dataset_store
from models_store.session import session_scope
from service.config import Settings
from service.main import create_app
from tests.service.conftest import LOCAL_URL

GOOD_X = [[0.0, 1.0], [1.0, 0.5], [2.0, -1.0], [3.0, 2.0], [4.0, 0.0]]
GOOD_Y = [1.0, 2.0, 0.5, 3.0, -1.0]


def assert_problem(response, status: int, detail: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["detail"] == detail
    assert body["title"]
    assert body["type"]
    assert body["instance"] == response.request.url.path
    return body


def post_json(client, path: str, body: dict):
    """POST ``body`` serialized by Python's json, which writes NaN and Infinity tokens."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def fit_body(**overrides) -> dict:
    return {"data": {"X": GOOD_X, "y": GOOD_Y}, "k": 2, "algorithm": "am", **overrides}


BAD_FITS = [
    pytest.param(
        fit_body(data={"X": [[0.0, 1.0], [1.0, float("nan")]], "y": [1.0, 2.0]}),
        "X[1][1] is NaN; all values must be finite numbers",
        id="nan-in-X",
    ),
    pytest.param(
        fit_body(data={"X": GOOD_X, "y": [1.0, 2.0, float("inf"), 3.0, 4.0]}),
        "y[2] is infinite; all values must be finite numbers",
        id="infinity-in-y",
    ),
    pytest.param(
        fit_body(data={"X": [[0.0, 1.0], [1.0], [2.0, 3.0]], "y": [1.0, 2.0, 3.0]}),
        "X row 1 has 1 value, expected 2 (the length of row 0)",
        id="ragged-X",
    ),
    pytest.param(
        fit_body(data={"X": [], "y": []}),
        "X is empty; at least one row is required; y is empty; at least one value is required",
        id="empty-X",
    ),
    pytest.param(
        fit_body(data={"X": GOOD_X, "y": GOOD_Y[:4]}),
        "y has 4 values but X has 5 rows",
        id="X-y-length-mismatch",
    ),
    pytest.param(fit_body(k=0), "k: Input should be greater than or equal to 1", id="k-below-1"),
    pytest.param(
        fit_body(k=5, holdout_fraction=0.2),
        "k=5 is more than the 4 training rows: holdout_fraction=0.2 holds out 1 of the 5 rows; "
        "lower k to at most 4, lower holdout_fraction (0 trains on every row), or add rows",
        id="k-above-training-rows",
    ),
    pytest.param(
        fit_body(algorithm="kmeans"),
        "algorithm 'kmeans' is unknown; choose one of auto, am, am-classic, subsample, "
        "subsample-exhaustive, subsample+am, em",
        id="unknown-algorithm",
    ),
    pytest.param(
        fit_body(params={"n_partitions": 10}),
        "params.n_partitions is not a parameter of algorithm 'am'; its parameters are "
        "step_size, max_iter, tol, n_init, init",
        id="parameter-of-another-algorithm",
    ),
    pytest.param(
        fit_body(algorithm="subsample-exhaustive", params={"subsample_size": 30}),
        # S(30, 2) = 2**29 - 1 partitions; S(17, 2) = 65,535 is the largest under the cap.
        "subsample-exhaustive would try more than 100,000 partitions (the cap) of "
        "subsample_size=30 rows into 2 parts; use subsample_size <= 17, or "
        "algorithm='subsample', which tries n_partitions random partitions",
        id="exhaustive-too-large",
    ),
    pytest.param(
        # Counting S(100000, 3) partitions once overflowed Python's recursion limit (a 500).
        fit_body(k=3, algorithm="subsample-exhaustive", params={"subsample_size": 100_000}),
        "subsample-exhaustive would try more than 100,000 partitions (the cap) of "
        "subsample_size=100000 rows into 3 parts; use subsample_size <= 12, or "
        "algorithm='subsample', which tries n_partitions random partitions",
        id="exhaustive-sub-sample-of-100000-rows",
    ),
    pytest.param(
        fit_body(k=[1, 2], algorithm="am"),
        "n_components[1]=2: 2 lines need at least 8 training rows (4 per line of 3 "
        "coefficients), there are 4; sweep k <= 1",
        id="sweep-k-with-too-few-rows-per-line",
    ),
    pytest.param(
        fit_body(holdout_fraction=0.95),
        "holdout_fraction: Input should be less than or equal to 0.9",
        id="holdout-too-large",
    ),
    pytest.param(
        fit_body(dataset_id="0" * 32),
        "give exactly one of dataset_id or data",
        id="two-data-sources",
    ),
    pytest.param(
        {"k": 2},
        "give exactly one of dataset_id or data",
        id="no-data",
    ),
    pytest.param(
        fit_body(params={"init": [[1.0, 2.0, 3.0]]}),
        "init must have shape (2, 3): one row per line with its coefficients, followed by its "
        "intercept when fit_intercept=True; got shape (1, 3)",
        id="init-of-wrong-shape",
    ),
    pytest.param(
        fit_body(seed=-1), "seed: Input should be greater than or equal to 0", id="negative-seed"
    ),
    pytest.param(
        fit_body(time_budget_s=0),
        "time_budget_s: Input should be greater than 0",
        id="time-budget-zero",
    ),
]


@pytest.mark.parametrize(("body", "detail"), BAD_FITS)
def test_bad_fit_requests_are_422_and_write_nothing(client, count_rows, body, detail):
    before = count_rows()
    assert_problem(post_json(client, "/fit", body), 422, detail)
    assert count_rows() == before


def test_validation_problems_list_each_error_with_its_location(client):
    body = assert_problem(
        client.post("/fit", json=fit_body(k=0, params={"step_size": -1})),
        422,
        "k: Input should be greater than or equal to 1; "
        "params.step_size: Input should be greater than 0",
    )
    assert [error["loc"] for error in body["errors"]] == [
        ["body", "k"],
        ["body", "params", "step_size"],
    ]


def test_nan_and_infinity_tokens_in_raw_json_are_rejected(client, count_rows):
    raw = b'{"data": {"X": [[1, 2], [3, NaN]], "y": [1, 2]}, "k": 1}'
    response = client.post("/fit", content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422, "X[1][1] is NaN; all values must be finite numbers")
    raw = b'{"X": [[1], [2]], "y": [Infinity, 1]}'
    response = client.post("/datasets", content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422, "y[0] is infinite; all values must be finite numbers")
    assert count_rows() == {"datasets": 0, "jobs": 0, "models": 0}


@pytest.mark.parametrize(
    ("path", "raw", "detail"),
    [
        (
            "/fit",
            b'{"k": 2,',
            "request body is not valid JSON: EOF while parsing a value at line 1 column 8",
        ),
        ("/fit", b"", "request body is required"),
        ("/fit", b"[1, 2]", "the fit request must be a JSON object"),
        ("/datasets", b"", "request body is required"),
        (
            "/datasets",
            b'{"X": [[1]], "y": [1],}',
            "request body is not valid JSON: trailing comma at line 1 column 23",
        ),
        ("/datasets", b"[1]", "request body: Input should be an object"),
    ],
)
def test_malformed_bodies(client, path, raw, detail):
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422, detail)


def test_unknown_dataset_in_a_fit_is_404(client, count_rows):
    missing = "f" * 32
    response = client.post("/fit", json={"dataset_id": missing, "k": 1})
    assert_problem(response, 404, f"dataset {missing} does not exist")
    assert count_rows() == {"datasets": 0, "jobs": 0, "models": 0}


@pytest.mark.parametrize(
    ("method", "path", "detail"),
    [
        ("GET", "/jobs/{id}", "job {id} does not exist"),
        ("POST", "/jobs/{id}/cancel", "job {id} does not exist"),
        ("GET", "/models/{id}", "model {id} does not exist"),
        ("DELETE", "/models/{id}", "model {id} does not exist"),
        ("POST", "/models/{id}/predict", "model {id} does not exist"),
        ("GET", "/datasets/{id}", "dataset {id} does not exist"),
    ],
)
def test_unknown_ids_are_404_naming_the_id(client, method, path, detail):
    missing = "a" * 32
    response = client.request(method, path.format(id=missing), json={"X": [[1.0]]})
    assert_problem(response, 404, detail.format(id=missing))


def test_predict_with_an_unknown_model_is_404(client):
    response = client.post("/predict", json={"model_id": "b" * 32, "X": [[1.0]]})
    assert_problem(response, 404, f"model {'b' * 32} does not exist")


def test_predict_with_the_wrong_feature_count(client, model_id):
    response = client.post("/predict", json={"model_id": model_id, "X": [[1.0, 2.0, 3.0]]})
    assert_problem(response, 422, f"model {model_id} expects 2 features, got 3")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"X": [[1.0, float("nan")]]}, "X[0][1] is NaN; all values must be finite numbers"),
        ({"X": [[1.0, 2.0], [1.0]]}, "X row 1 has 1 value, expected 2 (the length of row 0)"),
        ({"X": []}, "X is empty; at least one row is required"),
        ({"X": [[1.0, 2.0]], "y": [1.0, 2.0]}, "y has 2 values but X has 1 rows"),
        ({"X": [[1.0, 2.0]], "z": 1}, "z: Extra inputs are not permitted"),
    ],
)
def test_bad_predict_requests(client, model_id, body, detail):
    assert_problem(post_json(client, f"/models/{model_id}/predict", body), 422, detail)


def test_csv_without_the_target_column_is_422_and_writes_nothing(client, count_rows):
    response = client.post(
        "/datasets",
        files={"file": ("data.csv", b"a,b,c\n1,2,3\n", "text/csv")},
        data={"target": "target"},
    )
    assert_problem(response, 422, "CSV has no column 'target'; columns are a, b, c")
    assert count_rows() == {"datasets": 0, "jobs": 0, "models": 0}


def test_upload_of_an_unknown_file_type_is_415(client):
    response = client.post("/datasets", files={"file": ("data.xlsx", b"PK", "application/zip")})
    assert_problem(
        response,
        415,
        "cannot tell the format of file 'data.xlsx' (application/zip); upload a .csv, .parquet "
        "or .npz file, or two .npy files in the form fields X and y",
    )
    response = client.post("/datasets", content=b"x", headers={"content-type": "text/plain"})
    assert response.status_code == 415


@pytest.fixture
def small_limit_client(database_url):
    settings = Settings(
        database_url=database_url,
        embedded_worker=False,
        max_body_bytes=1000,
        max_upload_bytes=2000,
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as test_client:
        yield test_client


def test_body_over_the_limit_is_413_by_content_length(small_limit_client):
    body = fit_body(data={"X": [[float(i), 1.0] for i in range(200)], "y": [1.0] * 200})
    response = small_limit_client.post("/fit", json=body)
    assert_problem(
        response, 413, "request body exceeds the limit of 1000 bytes (MIXREG_MAX_BODY_BYTES)"
    )


def test_streamed_body_over_the_limit_is_413(small_limit_client):
    def chunks():
        yield b'{"X": ['
        for _ in range(200):
            yield b"[1.0, 2.0],"
        yield b'[1.0, 2.0]], "y": [1]}'

    response = small_limit_client.post(
        "/datasets", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(
        response, 413, "request body exceeds the limit of 1000 bytes (MIXREG_MAX_BODY_BYTES)"
    )
    # A file upload has its own limit, larger than other bodies'.
    upload = io.BytesIO(b"a,y\n" + b"1,2\n" * 300)
    response = small_limit_client.post(
        "/datasets", files={"file": ("d.csv", upload)}, data={"target": "y"}
    )
    assert response.status_code == 201, response.text
    upload = io.BytesIO(b"a,y\n" + b"1,2\n" * 600)
    response = small_limit_client.post(
        "/datasets", files={"file": ("d.csv", upload)}, data={"target": "y"}
    )
    assert_problem(
        response, 413, "request body exceeds the limit of 2000 bytes (MIXREG_MAX_UPLOAD_BYTES)"
    )


def test_idempotency_key_reused_for_another_body_is_409(client, count_rows):
    headers = {"Idempotency-Key": "retry-1"}
    first = client.post("/fit", json=fit_body(), headers=headers)
    assert first.status_code == 202
    job_id = first.json()["job_id"]
    before = count_rows()
    response = client.post("/fit", json=fit_body(seed=99), headers=headers)
    assert_problem(
        response,
        409,
        f"Idempotency-Key 'retry-1' was already used for a different request (job {job_id}); "
        "use a new key for a new request",
    )
    assert count_rows() == before


def test_unknown_route_and_wrong_method_are_problems(client):
    assert_problem(client.get("/nowhere"), 404, "no route matches GET /nowhere")
    assert_problem(client.put("/jobs"), 405, "PUT is not allowed on /jobs")


def test_bad_query_parameters(client):
    assert_problem(
        client.get("/jobs", params={"status": "done"}),
        422,
        "status: Input should be 'queued', 'running', 'succeeded', 'failed' or 'cancelled'",
    )
    assert_problem(
        client.get("/models", params={"limit": 0}),
        422,
        "limit: Input should be greater than or equal to 1",
    )


NO_ROWS = {"datasets": 0, "jobs": 0, "models": 0}


@pytest.mark.parametrize("path", ["/jobs", "/models", "/datasets"])
def test_an_offset_beyond_64_bits_is_422_and_the_largest_is_an_empty_page(client, path):
    assert_problem(
        client.get(path, params={"offset": 2**63}),
        422,
        "offset: Input should be less than or equal to 9223372036854775807",
    )
    response = client.get(path, params={"offset": 2**63 - 1})
    assert response.status_code == 200, response.text
    assert response.json()["items"] == []


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (
            b"a,y\n1," + b"1" * 200_000 + b"\n",
            "CSV line 2 cannot be read: field larger than field limit (131072)",
        ),
        (b"a,y\n1,2\r5\n", "CSV line 3 has 1 field, expected 2"),
        (
            b"a\x00,y\n1,2\n",
            "CSV header column 1 contains a NUL character (\\u0000), which cannot be stored",
        ),
    ],
    ids=["field-over-the-csv-limit", "carriage-return-inside-a-row", "nul-in-a-column-name"],
)
def test_unreadable_csv_is_422_and_writes_nothing(client, count_rows, content, detail):
    response = client.post(
        "/datasets", params={"target": "y"}, content=content, headers={"content-type": "text/csv"}
    )
    assert_problem(response, 422, detail)
    response = client.post(
        "/datasets", files={"file": ("d.csv", content, "text/csv")}, data={"target": "y"}
    )
    assert_problem(response, 422, detail)
    assert count_rows() == NO_ROWS


def test_csv_with_carriage_return_line_ends_is_read(client):
    response = client.post(
        "/datasets",
        params={"target": "y"},
        content=b'a,y\r1,2\r"3",4\r',
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 201, response.text
    assert (response.json()["n_rows"], response.json()["feature_names"]) == (2, ["a"])


def npz_upload(client, content: bytes):
    return client.post("/datasets", files={"file": ("d.npz", content, "application/octet-stream")})


def npz_header(shape: tuple[int, ...]) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    return header.getvalue()


def zip_of(**members: bytes) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        for name, content in members.items():
            zipped.writestr(name, content)
    return archive.getvalue()


def good_npz(*, compressed: bool = False) -> bytearray:
    archive = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(archive, X=np.arange(6.0).reshape(3, 2), y=np.arange(3.0))
    return bytearray(archive.getvalue())


def corrupted(content: bytearray, offset: int) -> bytes:
    content[offset] ^= 0xFF
    return bytes(content)


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b"hello", "file is not a readable NPZ archive: it is not a zip file"),
        (
            zip_of(**{"X.npy": b"garbage", "y.npy": b"garbage"}),
            "NPZ member 'X.npy' is not a .npy array",
        ),
        (
            zip_of(**{"X.npy": npz_header((10**6, 10**6)), "y.npy": npz_header((10**6,))}),
            "NPZ array 'X' declares shape (1000000, 1000000) of float64 (8,000,000,000,000 "
            "bytes) but holds only 0 bytes",
        ),
        (
            zip_of(**{"X.npy": npz_header((1000, 2)) + b"\0" * 64, "y.npy": b""}),
            "NPZ array 'X' declares shape (1000, 2) of float64 (16,000 bytes) but holds only "
            "64 bytes",
        ),
        # Byte 55 starts the first member's data (after its 55-byte local header).
        (corrupted(good_npz(), 100), "NPZ array 'X' cannot be read: Bad CRC-32 for file 'X.npy'"),
        (
            corrupted(good_npz(compressed=True), 55),
            "NPZ array 'X' cannot be read: Error -3 while decompressing data: "
            "invalid code lengths set",
        ),
    ],
    ids=[
        "not-a-zip",
        "members-that-are-not-npy",
        "header-declaring-terabytes",
        "header-declaring-more-than-the-member-holds",
        "bad-crc",
        "corrupt-deflate-stream",
    ],
)
def test_broken_npz_archives_are_422_and_write_nothing(client, count_rows, content, detail):
    assert_problem(npz_upload(client, content), 422, detail)
    assert count_rows() == NO_ROWS


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (
            b'{"X": [[1.0]], "y": [1.0], "name": "a\\u0000b"}',
            "name: contains a NUL character (\\u0000), which cannot be stored",
        ),
    ],
    ids=["nul-in-name"],
)
def test_text_that_cannot_be_stored_is_422(client, count_rows, raw, detail):
    response = client.post("/datasets", content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422, detail)
    assert count_rows() == NO_ROWS


BAD_FITS_FOUND_BY_FUZZING = [
    pytest.param(
        fit_body(params={"init": [[float("nan"), 1.0, 1.0], [1.0, 1.0, 1.0]]}),
        "params.init[0][0] is NaN; all values must be finite numbers",
        id="nan-in-init",
    ),
    pytest.param(
        fit_body(params={"init": []}),
        "params.init is empty; at least one row is required",
        id="empty-init",
    ),
    pytest.param(
        fit_body(algorithm="subsample", params={"subsample_size": 10**9}),
        "params.subsample_size: Input should be less than or equal to 100000",
        id="subsample-size-huge",
    ),
    pytest.param(
        fit_body(k=True), "k: Input should be an integer or a list of integers", id="k-true"
    ),
    pytest.param(
        fit_body(params={"max_iter": 10.0}),
        "params.max_iter: Input should be a valid integer",
        id="max-iter-float",
    ),
    pytest.param(
        fit_body(data={"X": GOOD_X, "y": [1.0, 2.0, 1e200, 3.0, 4.0]}),
        "y[2] = 1e+200 is too large: squared errors overflow a float64 beyond |y| = 1e+150; "
        "scale y down",
        id="y-squared-overflows",
    ),
    pytest.param(
        fit_body(data={"X": [*GOOD_X[:4], [1e154, 1e154]], "y": GOOD_Y}),
        "X row 4 is too large: the sum of its squared values overflows a float64; scale X down",
        id="row-norm-overflows",
    ),
    pytest.param(
        fit_body(data={"X": [[1.0], [2.0]], "y": [1.0, 2.0], "feature_names": ["\ud800"]}),
        "data.feature_names[0]: contains the unpaired surrogate \\ud800, which is not a character",
        id="lone-surrogate-in-a-feature-name",
    ),
    pytest.param(
        fit_body(name="job\u0000"),
        "name: contains a NUL character (\\u0000), which cannot be stored",
        id="nul-in-name",
    ),
]


@pytest.mark.parametrize(("body", "detail"), BAD_FITS_FOUND_BY_FUZZING)
def test_fits_checkable_at_submit_are_422_and_write_nothing(client, count_rows, body, detail):
    assert_problem(post_json(client, "/fit", body), 422, detail)
    assert count_rows() == NO_ROWS


def test_huge_n_partitions_is_refused_by_its_limit_or_accepted_without_allocating(
    client, database_url
):
    body = fit_body(algorithm="subsample", params={"n_partitions": 10**12})
    assert_problem(
        post_json(client, "/fit", body),
        422,
        "params.n_partitions = 1000000000000 is above the limit of 100000 "
        "(MIXREG_MAX_N_PARTITIONS)",
    )
    settings = Settings(database_url=database_url, embedded_worker=False, max_n_partitions=10**12)
    with TestClient(create_app(settings), base_url=LOCAL_URL) as unlimited:
        response = post_json(unlimited, "/fit", body)
        assert response.status_code == 202, response.text
        job = unlimited.get(response.json()["url"]).json()
    assert job["params"]["n_partitions"] == 10**12


def test_a_stored_dataset_too_large_to_square_fails_its_job_with_a_clear_error(
    client, app_sessionmaker, run_queued_jobs
):
    # Stored directly: uploads of such data are refused, but older datasets may hold it.
    X = np.arange(20.0).reshape(10, 2)
    with session_scope(app_sessionmaker) as session:
        dataset_id = dataset_store.create_dataset(
            session,
            X=X,
            y=np.full(10, 1e200),
            feature_names=["a", "b"],
            target_name=None,
            name=None,
        ).id
    response = client.post("/fit", json={"dataset_id": dataset_id, "k": 2, "algorithm": "am"})
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["failed"]
    job = client.get(response.json()["url"]).json()
    assert job["error"] == (
        "|y| reaches 1e+200: squared errors of such values overflow a float64; "
        "scale y down (|y| <= 1e+150)"
    )


def test_subnormal_data_fails_its_job_with_a_clear_error(client, count_rows, run_queued_jobs):
    X = (np.arange(40.0).reshape(20, 2) % 7 + 1) * 1e-310
    y = np.arange(20.0) % 3
    response = client.post(
        "/fit",
        json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am"},
    )
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["failed"]
    job = client.get(response.json()["url"]).json()
    # Slopes of about 1e310 cannot be written down: the error says why and what to scale.
    assert job["error"].startswith("the fitted lines overflow a float64: a feature spreads over")
    assert job["error"].endswith("; scale X up or y down")
    assert count_rows()["models"] == 0


@pytest.mark.parametrize("bad_id", ["zz", "%00", "A" * 32, "0" * 31 + "g"])
def test_ids_that_are_not_hex_are_404(client, bad_id):
    shown = "\x00" if bad_id == "%00" else bad_id
    assert_problem(client.get(f"/jobs/{bad_id}"), 404, f"job {shown} does not exist")
    assert_problem(client.delete(f"/models/{bad_id}"), 404, f"model {shown} does not exist")
    response = client.post("/predict", json={"model_id": shown, "X": [[1.0]]})
    if shown == "\x00":
        assert_problem(
            response, 422, "model_id: contains a NUL character (\\u0000), which cannot be stored"
        )
    else:
        assert_problem(response, 404, f"model {shown} does not exist")
