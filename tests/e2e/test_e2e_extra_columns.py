"""Extra columns over real HTTP: CSV, Parquet, NPZ and JSON uploads keep columns beside the
features (read back from the server's SQLite file value for value), GET shows them with their
types, the client sends a DataFrame's kept columns, and bad keep options are 422s naming the
column."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixreg_client import Client
from models_store import datasets as dataset_store
from models_store.session import make_engine, make_sessionmaker, session_scope

from .conftest import Server, mixture_data

pytestmark = pytest.mark.e2e

N_ROWS = 120
USERS = np.array([f"user-{i % 7}" if i % 11 else None for i in range(N_ROWS)], dtype=object)


def weights() -> np.ndarray:
    values = np.linspace(0.5, 2.0, N_ROWS)
    values[::13] = np.nan
    return values


@pytest.fixture(scope="module")
def database_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("extra") / "mixreg.db"


@pytest.fixture(scope="module")
def server(database_path: Path) -> Iterator[Server]:
    server = Server(
        database_url=f"sqlite:///{database_path}",
        log_path=database_path.with_name("server.log"),
        settings={},
    )
    server.start()
    yield server
    server.stop()
    server.client.close()


def stored_columns(database_path: Path, dataset_id: str, names: list[str]) -> dict:
    engine = make_engine(f"sqlite:///{database_path}")
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
            assert dataset is not None
            return dataset_store.load_dataset_columns(dataset, names)
    finally:
        engine.dispose()


def csv_text(X: np.ndarray, y: np.ndarray) -> bytes:
    lines = ["a,user,b,w,y"]
    for (a, b), user, w, target in zip(
        X.tolist(), USERS, weights().tolist(), y.tolist(), strict=True
    ):
        lines.append(f"{a!r},{user or ''},{b!r},{'' if np.isnan(w) else repr(w)},{target!r}")
    return ("\n".join(lines) + "\n").encode()


def parquet_bytes(X: np.ndarray, y: np.ndarray) -> bytes:
    table = pa.table(
        {
            "a": X[:, 0],
            "b": X[:, 1],
            "user": pa.array(USERS.tolist(), pa.string()),
            "w": weights(),
            "y": y,
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=50)
    return buffer.getvalue()


def npz_bytes(X: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    users = np.array([user or "" for user in USERS], dtype=str)
    np.savez(buffer, X=X, y=y, feature_names=np.array(["a", "b"]), user=users, w=weights())
    return buffer.getvalue()


def check_kept(server: Server, database_path: Path, body: dict, X: np.ndarray) -> None:
    assert body["feature_names"] == ["a", "b"]
    assert body["columns"] == [
        {"name": "user", "type": "string"},
        {"name": "w", "type": "number"},
    ]
    shown = server.request("GET", body["url"]).json()
    assert shown["columns"] == body["columns"]
    stored = stored_columns(database_path, body["id"], ["user", "w"])
    assert stored["user"].tolist() == USERS.tolist()
    np.testing.assert_array_equal(stored["w"], weights())


def test_every_format_keeps_the_named_columns(server: Server, database_path: Path):
    X, y = mixture_data(n_rows=N_ROWS, seed=4)
    X = X[:, :2]
    uploads = {
        "csv file, keep repeated": {
            "files": {"file": ("d.csv", csv_text(X, y), "text/csv")},
            "data": {"target": "y", "keep": ["user", "w"]},
        },
        "raw csv, keep comma-separated": {
            "content": csv_text(X, y),
            "headers": {"content-type": "text/csv"},
            "params": {"target": "y", "keep": "user,w"},
        },
        "parquet file": {
            "files": {"file": ("d.parquet", parquet_bytes(X, y), "application/octet-stream")},
            "data": {"target": "y", "keep": "user,w"},
        },
        "raw npz": {
            "content": npz_bytes(X, y),
            "headers": {"content-type": "application/x-npz"},
            "params": {"keep": ["user", "w"]},
        },
        "json": {
            "json": {
                "X": X.tolist(),
                "y": y.tolist(),
                "feature_names": ["a", "b"],
                "columns": {
                    "user": USERS.tolist(),
                    "w": [None if np.isnan(w) else w for w in weights().tolist()],
                },
            }
        },
    }
    for label, request in uploads.items():
        response = server.request("POST", "/datasets", **request)
        assert response.status_code == 201, (label, response.text)
        check_kept(server, database_path, response.json(), X)
    listed = server.request("GET", "/datasets", params={"limit": 1}).json()["items"][0]
    assert [column["name"] for column in listed["columns"]] == ["user", "w"]


def test_a_dataset_without_kept_columns_shows_none(server: Server):
    X, y = mixture_data(n_rows=20)
    response = server.request("POST", "/datasets", json={"X": X.tolist(), "y": y.tolist()})
    assert response.status_code == 201, response.text
    assert response.json()["columns"] == []


def assert_422(response, detail: str) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == detail


def test_bad_keep_options_are_422s_naming_the_column(server: Server):
    X, y = mixture_data(n_rows=N_ROWS, seed=4)
    X = X[:, :2]
    csv_body = {"content": csv_text(X, y), "headers": {"content-type": "text/csv"}}
    assert_422(
        server.request("POST", "/datasets", params={"target": "y", "keep": "usr"}, **csv_body),
        "keep names 'usr', but CSV has the columns a, user, b, w, y",
    )
    assert_422(
        server.request(
            "POST",
            "/datasets",
            params={"target": "y", "keep": "a", "features": ["a", "b"]},
            **csv_body,
        ),
        "keep and features both name the column 'a'; a kept column is never a feature",
    )
    npy_pair = {"X": ("X.npy", io.BytesIO()), "y": ("y.npy", io.BytesIO())}
    for name, array in (("X", X), ("y", y)):
        np.save(npy_pair[name][1], array)
        npy_pair[name][1].seek(0)
    assert_422(
        server.request("POST", "/datasets", files=npy_pair, data={"keep": "user"}),
        "keep: extra columns need a CSV, Parquet, NPZ or JSON upload; two .npy files hold only "
        "X and y",
    )
    assert_422(
        server.request(
            "POST", "/datasets", params={"keep": "g"}, json={"X": X.tolist(), "y": y.tolist()}
        ),
        "keep names columns of a CSV, Parquet or NPZ upload; a JSON body gives its extra columns "
        "as columns: {name: [values...]}",
    )
    assert_422(
        server.request(
            "POST",
            "/datasets",
            json={"X": X.tolist(), "y": y.tolist(), "columns": {"g": [1.0, "a"] * (N_ROWS // 2)}},
        ),
        "columns['g'] mixes numbers and text; give all its values as one kind",
    )


def test_the_client_sends_a_dataframes_kept_columns(server: Server, database_path: Path):
    X, y = mixture_data(n_rows=N_ROWS, seed=5)
    frame = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "user": USERS, "w": weights(), "y": y})
    with Client(server.base_url) as client:
        dataset = client.upload(frame, target="y", keep=["user", "w"])
        assert dataset.columns == {"user": "string", "w": "number"}
        assert dataset.feature_names == ["a", "b"]
        assert client.get_dataset(dataset.id).columns == dataset.columns
    stored = stored_columns(database_path, dataset.id, ["user", "w"])
    assert stored["user"].tolist() == USERS.tolist()
    np.testing.assert_array_equal(stored["w"], weights())


def test_an_idempotent_retry_replays_only_the_same_kept_columns(server: Server):
    X, y = mixture_data(n_rows=N_ROWS, seed=6)
    X = X[:, :2]
    body = {
        "content": csv_text(X, y),
        "headers": {"content-type": "text/csv", "Idempotency-Key": "kept-retry"},
    }
    first = server.request("POST", "/datasets", params={"target": "y", "keep": "user,w"}, **body)
    assert first.status_code == 201, first.text
    again = server.request("POST", "/datasets", params={"target": "y", "keep": "user,w"}, **body)
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    # The same rows with the kept columns in another order are another upload.
    other = server.request("POST", "/datasets", params={"target": "y", "keep": "w,user"}, **body)
    assert other.status_code == 409, other.text
