"""Big data in, fast predictions out, over real HTTP: every upload format stores the same
numbers bit for bit (read back from the server's SQLite file), a fit reads them back in chunks,
and predictions come as JSON or .npy; bad bytes get a 4xx naming the problem."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models_store import datasets as dataset_store
from models_store.session import make_engine, make_sessionmaker, session_scope

from .conftest import Server, mixture_data

pytestmark = pytest.mark.e2e

NPY = "application/x-npy"
PARQUET = "application/vnd.apache.parquet"


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def parquet(X: np.ndarray, y: np.ndarray) -> bytes:
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=64)
    return buffer.getvalue()


def csv(X: np.ndarray, y: np.ndarray) -> bytes:
    rows = [f"{a!r},{b!r},{c!r},{t!r}" for (a, b, c), t in zip(X.tolist(), y.tolist(), strict=True)]
    return ("a,b,c,y\n" + "\n".join(rows) + "\n").encode()


def npz(X: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y, feature_names=np.array(["a", "b", "c"]))
    return buffer.getvalue()


def parquet_table(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def assert_problem(response, status: int, detail_start: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["detail"].startswith(detail_start), body["detail"]
    return body


@pytest.fixture(scope="module")
def database_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("formats") / "mixreg.db"


@pytest.fixture(scope="module")
def server(database_path: Path) -> Iterator[Server]:
    """One server on a SQLite file for the module, with small limits to run into."""
    server = Server(
        database_url=f"sqlite:///{database_path}",
        log_path=database_path.with_name("server.log"),
        settings={"MIXREG_MAX_ROWS": "5000", "MIXREG_MAX_UPLOAD_BYTES": "3000000"},
    )
    server.start()
    yield server
    server.stop()
    server.client.close()


def stored_arrays(database_path: Path, dataset_id: str) -> tuple[np.ndarray, np.ndarray]:
    engine = make_engine(f"sqlite:///{database_path}")
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
            assert dataset is not None
            return dataset_store.load_dataset_arrays(dataset)
    finally:
        engine.dispose()


def test_every_upload_format_stores_the_same_numbers(server: Server, database_path: Path):
    X, y = mixture_data(n_rows=300)
    X[0, 0], X[1, 1] = -0.0, 5e-324
    uploads = {
        "csv file": {"files": {"file": ("d.csv", csv(X, y), "text/csv")}, "data": {"target": "y"}},
        "raw csv": {
            "content": csv(X, y),
            "headers": {"content-type": "text/csv"},
            "params": {"target": "y"},
        },
        "parquet file": {
            "files": {"file": ("d.parquet", parquet(X, y), "application/octet-stream")},
            "data": {"target": "y"},
        },
        "raw parquet": {
            "content": parquet(X, y),
            "headers": {"content-type": PARQUET},
            "params": {"target": "y", "name": "raw"},
        },
        "npy pair": {
            "files": {"X": ("X.npy", npy(X)), "y": ("y.npy", npy(y))},
            "data": {"feature_names": ["a", "b", "c"]},
        },
        "npz file": {
            "files": {"file": ("d.npz", npz(X, y), "application/octet-stream")},
        },
        "json": {"json": {"X": X.tolist(), "y": y.tolist(), "feature_names": ["a", "b", "c"]}},
    }
    for label, request in uploads.items():
        response = server.request("POST", "/datasets", **request)
        assert response.status_code == 201, (label, response.text)
        dataset = response.json()
        assert (dataset["n_rows"], dataset["n_features"]) == (300, 3), label
        assert dataset["feature_names"] == ["a", "b", "c"], label
        X_stored, y_stored = stored_arrays(database_path, dataset["id"])
        np.testing.assert_array_equal(X_stored.view(np.uint64), X.view(np.uint64), err_msg=label)
        np.testing.assert_array_equal(y_stored.view(np.uint64), y.view(np.uint64), err_msg=label)


@pytest.mark.parametrize(
    ("request_kwargs", "status", "detail"),
    [
        pytest.param(
            {
                "files": {"file": ("d.parquet", parquet(*mixture_data(50))[:-30])},
                "data": {"target": "y"},
            },
            422,
            "file is not a readable Parquet file",
            id="truncated-parquet",
        ),
        pytest.param(
            {
                "content": parquet_table(pa.table({"a": ["x", "y"], "y": [1.0, 2.0]})),
                "headers": {"content-type": PARQUET},
                "params": {"target": "y"},
            },
            422,
            "Parquet column 'a' holds string, not numbers",
            id="parquet-of-strings",
        ),
        pytest.param(
            {
                "files": {
                    "X": ("X.npy", npy(np.array([["a"]], dtype=object))),
                    "y": ("y.npy", npy(np.ones(1))),
                }
            },
            422,
            "X.npy must hold numbers, got dtype object",
            id="npy-of-objects",
        ),
        pytest.param(
            {"files": {"X": ("X.npy", npy(np.ones((2, 2, 2)))), "y": ("y.npy", npy(np.ones(2)))}},
            422,
            "X.npy must be 2-dimensional, got shape (2, 2, 2)",
            id="npy-of-the-wrong-shape",
        ),
        pytest.param(
            {"files": {"X": ("X.npy", npy(np.ones((2, 2))))}},
            422,
            "multipart upload of .npy files needs both file fields X and y; y is missing",
            id="npy-without-y",
        ),
        pytest.param(
            {"files": {"file": ("d.csv", b"a,y\n1,2\n3,x\n")}, "data": {"target": "y"}},
            422,
            "CSV line 3, column 'y': 'x' is not a number",
            id="csv-with-a-word",
        ),
        pytest.param(
            {
                "content": b"a,y\n" + b"1,2\n" * 5001,
                "headers": {"content-type": "text/csv"},
                "params": {"target": "y"},
            },
            413,
            "the dataset has more than 5,000 rows; at most 5,000 are accepted (MIXREG_MAX_ROWS)",
            id="too-many-rows",
        ),
        pytest.param(
            {
                "content": b"a,y\n" + b"1,2\n" * 800_000,
                "headers": {"content-type": "text/csv"},
                "params": {"target": "y"},
            },
            413,
            "request body exceeds the limit of 3000000 bytes (MIXREG_MAX_UPLOAD_BYTES)",
            id="too-many-bytes",
        ),
        pytest.param(
            {"content": b"\x00\x01", "headers": {"content-type": "application/x-excel"}},
            415,
            "Content-Type 'application/x-excel' is not accepted",
            id="unknown-type",
        ),
    ],
)
def test_bad_uploads_are_refused_naming_the_problem(server: Server, request_kwargs, status, detail):
    before = server.request("GET", "/datasets").json()["total"]
    assert_problem(server.request("POST", "/datasets", **request_kwargs), status, detail)
    assert server.request("GET", "/datasets").json()["total"] == before


@pytest.fixture(scope="module")
def model(server: Server) -> dict:
    """A model fitted on a Parquet upload: the fit reads the dataset back in chunks."""
    X, y = mixture_data(n_rows=400, seed=4)
    response = server.request(
        "POST",
        "/datasets",
        content=parquet(X, y),
        headers={"content-type": PARQUET},
        params={"target": "y"},
    )
    assert response.status_code == 201, response.text
    job = server.wait_for_job(
        server.fit({"dataset_id": response.json()["id"], "k": 2, "algorithm": "am", "seed": 1})
    )
    assert job["status"] == "succeeded", job
    assert job["progress"]["n_components"] == 2
    return server.request("GET", job["model_url"]).json()


def test_binary_predictions_equal_json_predictions(server: Server, model: dict):
    X, y = mixture_data(n_rows=1000, seed=9)
    path = f"/models/{model['id']}/predict"
    as_json = server.request("POST", path, json={"X": X.tolist()})
    assert as_json.status_code == 200
    expected = np.array(as_json.json()["predictions"])

    both_binary = server.request(
        "POST", path, content=npy(X), headers={"content-type": NPY, "accept": NPY}
    )
    assert both_binary.status_code == 200, both_binary.text
    assert both_binary.headers["content-type"] == NPY
    predictions = np.load(io.BytesIO(both_binary.content), allow_pickle=False)
    assert predictions.shape == (1000, 2) and predictions.dtype == np.float64
    np.testing.assert_array_equal(predictions, expected)

    npy_in = server.request(
        "POST",
        "/predict",
        params={"model_id": model["id"]},
        content=npy(X.astype(np.float32)),
        headers={"content-type": NPY},
    )
    assert npy_in.status_code == 200 and npy_in.headers["content-type"] == "application/json"
    assert np.array(npy_in.json()["predictions"]).shape == (1000, 2)

    npy_out = server.request(
        "POST",
        "/predict",
        json={"model_id": model["id"], "X": X.tolist()},
        headers={"accept": "application/json;q=0.5, application/x-npy"},
    )
    np.testing.assert_array_equal(np.load(io.BytesIO(npy_out.content)), expected)
    json_preferred = server.request(
        "POST", path, json={"X": X[:2].tolist()}, headers={"accept": "application/x-npy;q=0.1, */*"}
    )
    assert json_preferred.headers["content-type"] == "application/json"

    scored = server.request("POST", path, json={"X": X.tolist(), "y": y.tolist()}).json()
    assert set(scored) == {"model_id", "predictions", "min_loss", "best_component"}
    assert len(scored["best_component"]) == 1000


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        (
            npy(np.ones((3, 3)))[:-7],
            {"content-type": NPY},
            422,
            "the .npy body declares shape (3, 3)",
        ),
        (
            b"\x93NUMPY\x01\x00\x10\x00{broken",
            {"content-type": NPY},
            422,
            "the .npy body has an unreadable",
        ),
        (
            npy(np.array([["1"]], dtype="<U1")),
            {"content-type": NPY},
            422,
            "the .npy body must hold numbers, got dtype <U1",
        ),
        (
            npy(np.ones(3)),
            {"content-type": NPY},
            422,
            "the .npy body must be 2-dimensional, got shape (3,)",
        ),
        (npy(np.ones((2, 5))), {"content-type": NPY}, 422, "model {id} expects 3 features, got 5"),
        (npy(np.array([[1.0, np.inf, 0.0]])), {"content-type": NPY}, 422, "X[0][1] is infinite"),
        (
            b"X=1",
            {"content-type": "application/x-www-form-urlencoded"},
            415,
            "Content-Type 'application/x-www-form-urlencoded' is not accepted",
        ),
        (
            b'{"X": [[1, 2, 3]], "y": [1]}',
            {"content-type": "application/json", "accept": NPY},
            406,
            "an application/x-npy answer holds only the predictions",
        ),
    ],
)
def test_bad_predict_bodies_are_refused_naming_the_problem(
    server: Server, model: dict, body, headers, status, detail
):
    response = server.request(
        "POST", f"/models/{model['id']}/predict", content=body, headers=headers
    )
    assert_problem(response, status, detail.format(id=model["id"]))


def test_an_npy_body_on_predict_needs_the_model_named(server: Server):
    response = server.request(
        "POST", "/predict", content=npy(np.ones((1, 3))), headers={"content-type": NPY}
    )
    assert_problem(response, 422, "name the model: an .npy body is sent to POST /models/")


@pytest.mark.postgres
def test_a_parquet_upload_and_its_fit_on_postgresql(postgres_url, tmp_path):
    # The PostgreSQL variant of the round trip: chunks in bytea, read with a server-side cursor.
    server = Server(database_url=postgres_url, log_path=tmp_path / "server.log", settings={})
    server.start()
    try:
        _upload_and_fit(server, postgres_url)
    finally:
        server.stop()
        server.client.close()


def _upload_and_fit(server: Server, postgres_url: str) -> None:
    X, y = mixture_data(n_rows=500, seed=6)
    response = server.request(
        "POST", "/datasets", files={"file": ("d.parquet", parquet(X, y))}, data={"target": "y"}
    )
    assert response.status_code == 201, response.text
    engine = make_engine(postgres_url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            dataset = dataset_store.get_dataset(session, dataset_id=response.json()["id"])
            X_stored, y_stored = dataset_store.load_dataset_arrays(dataset)
    finally:
        engine.dispose()
    np.testing.assert_array_equal(X_stored, X)
    np.testing.assert_array_equal(y_stored, y)
    job = server.wait_for_job(
        server.fit({"dataset_id": response.json()["id"], "k": 2, "algorithm": "am"})
    )
    assert job["status"] == "succeeded", job


def readme_block(heading: str) -> str:
    """The first fenced bash block after the README paragraph that starts with ``heading``."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = readme.split(heading, 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_readme_binary_prediction_example_runs_as_written(make_sqlite_server, tmp_path):
    server = make_sqlite_server()  # the default limits: the example sends 100,000 rows
    X, y = mixture_data(n_rows=200, seed=8)
    job = server.wait_for_job(
        server.fit({"data": {"X": X[:, :2].tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am"})
    )
    assert job["status"] == "succeeded", job
    venv = Path(sys.executable).parent
    completed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block("**Binary predictions.**")],
        cwd=tmp_path,
        env={
            **os.environ,
            "PATH": f"{venv}:{os.environ['PATH']}",
            "BASE": server.base_url,
            "MODEL": job["model_id"],
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().endswith("(100000, 2)")
    predictions = np.load(tmp_path / "predictions.npy")
    rows = np.load(tmp_path / "rows.npy")
    expected = server.request(
        "POST", f"/models/{job['model_id']}/predict", json={"X": rows[:3].tolist()}
    ).json()["predictions"]
    np.testing.assert_array_equal(predictions[:3], expected)


def export_with_id_and_text(X: np.ndarray, y: np.ndarray, delimiter: str) -> bytes:
    """A spreadsheet's export: an id and a text column beside the numbers, a chosen delimiter."""
    header = delimiter.join(["id", "a", "comment", "b", "c", "y"])
    rows = [
        delimiter.join([f"row-{index}", repr(a), f'"note {index}, ok"', repr(b), repr(c), repr(t)])
        for index, ((a, b, c), t) in enumerate(zip(X.tolist(), y.tolist(), strict=True))
    ]
    return ("\n".join([header, *rows]) + "\n").encode()


@pytest.mark.parametrize("delimiter", [",", ";", "\t"], ids=["comma", "semicolon", "tab"])
def test_csv_columns_chosen_by_name_with_any_delimiter(
    server: Server, database_path: Path, delimiter: str
):
    X, y = mixture_data(n_rows=50, seed=3)
    content = export_with_id_and_text(X, y, delimiter)
    raw = server.request(
        "POST",
        "/datasets",
        content=content,
        headers={"content-type": "text/csv"},
        params={"target": "y", "ignore": ["id", "comment"]},
    )
    assert raw.status_code == 201, raw.text
    assert raw.json()["feature_names"] == ["a", "b", "c"]
    stored_X, stored_y = stored_arrays(database_path, raw.json()["id"])
    np.testing.assert_array_equal(stored_X, X)
    np.testing.assert_array_equal(stored_y, y)

    form = server.request(
        "POST",
        "/datasets",
        files={"file": ("export.csv", content, "text/csv")},
        data={"target": "y", "features": ["c", "a"], "delimiter": delimiter},
    )
    assert form.status_code == 201, form.text
    assert form.json()["feature_names"] == ["c", "a"]
    np.testing.assert_array_equal(stored_arrays(database_path, form.json()["id"])[0], X[:, [2, 0]])


def test_csv_and_parquet_column_options_refused_naming_the_problem(server: Server):
    X, y = mixture_data(n_rows=10)
    semicolons = csv(X, y).replace(b",", b";")
    wrong_delimiter = server.request(
        "POST",
        "/datasets",
        content=semicolons,
        headers={"content-type": "text/csv"},
        params={"target": "y", "delimiter": ","},
    )
    assert_problem(
        wrong_delimiter,
        422,
        "CSV has no column 'y'; columns are a;b;c;y (the header looks separated by ';': give "
        "the delimiter, delimiter=';')",
    )
    for params, detail in (
        ({"features": ["a", "zz"]}, "features names 'zz', but CSV has the columns a, b, c, y"),
        ({"ignore": ["y"]}, "ignore names the target column 'y'"),
        ({"features": ["a"], "ignore": ["b"]}, "give the feature columns or the columns to"),
    ):
        response = server.request(
            "POST",
            "/datasets",
            content=csv(X, y),
            headers={"content-type": "text/csv"},
            params={"target": "y", **params},
        )
        assert_problem(response, 422, detail)
    table = pa.table({"id": ["r"] * 10, "a": X[:, 0], "b": X[:, 1], "y": y})
    with_text = server.request(
        "POST",
        "/datasets",
        content=parquet_table(table),
        headers={"content-type": PARQUET},
        params={"target": "y", "ignore": ["id"]},
    )
    assert with_text.status_code == 201, with_text.text
    assert with_text.json()["feature_names"] == ["a", "b"]
    npz_with_delimiter = server.request(
        "POST",
        "/datasets",
        content=npz(X, y),
        headers={"content-type": "application/x-npz"},
        params={"delimiter": ";"},
    )
    assert_problem(npz_with_delimiter, 422, "delimiter applies to named columns")
