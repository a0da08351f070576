"""Missing values and lists of names over real HTTP: ``na=drop`` leaves out the rows with an
empty feature or target cell and says how many per column (CSV as a multipart file or a raw
body, a DataFrame or Parquet file through the client, ``mixreg fit --na drop``); the default
refuses naming the column; the client names a NaN before sending it; ``ignore``, ``keep``,
``features`` and ``feature_names`` take comma lists and repeated fields alike."""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixreg_client import Client

from .conftest import REPO, Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

# A recommender's export: string ids, a title with commas, and a few empty cells.
RATINGS = (
    "user_id,item_id,title,year,price,rating\n"
    'u00044,i1,"Heat, Part 1",1995,9.5,4.0\n'
    'u00045,i2,"Up",2009,,3.5\n'
    'u00046,i3,"Alien, the",1979,7.0,\n'
    'u00047,i4,"Ran",,8.0,4.5\n'
    'u00048,i5,"Brazil",1985,6.5,3.0\n'
    'u00049,i6,"Heat, Part 2",2001,5.0,2.5\n'
    'u00050,i7,"Tron",1982,4.5,3.5\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "missing")


def upload_csv(server: Server, fields: list[tuple[str, str]], text: str = RATINGS):
    form: dict[str, list[str]] = {}
    for name, value in fields:
        form.setdefault(name, []).append(value)
    return server.client.post(
        "/datasets", files={"file": ("ratings.csv", text.encode(), "text/csv")}, data=form
    )


# --- na ---


def test_one_empty_cell_refuses_the_upload_naming_it_and_the_fix(server: Server):
    answer = upload_csv(server, [("target", "rating"), ("ignore", "user_id,item_id,title")])
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith("CSV line 3, column 'price' is empty;")
    assert "na=drop" in detail


def test_na_drop_leaves_out_the_rows_and_counts_them_per_column(server: Server):
    answer = upload_csv(
        server,
        [("target", "rating"), ("ignore", "user_id,item_id,title"), ("na", "drop")],
    )
    assert answer.status_code == 201, answer.text
    dataset = answer.json()
    assert dataset["n_rows"] == 4
    assert dataset["feature_names"] == ["year", "price"]
    assert dataset["dropped_rows"] == {"year": 1, "price": 1, "rating": 1}
    # The stored dataset has the rows that were kept.
    stored = server.client.get(f"/datasets/{dataset['id']}").json()
    assert stored["n_rows"] == 4


def test_na_drop_on_a_raw_csv_body_and_a_bad_policy(server: Server):
    answer = server.client.post(
        "/datasets",
        params={"target": "rating", "ignore": "user_id,item_id,title", "na": "drop"},
        content=RATINGS.encode(),
        headers={"Content-Type": "text/csv"},
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["dropped_rows"] == {"year": 1, "price": 1, "rating": 1}

    bad = upload_csv(server, [("target", "rating"), ("ignore", "user_id,item_id,title"),
                              ("na", "skip")])  # fmt: skip
    assert bad.status_code == 422
    assert bad.json()["detail"] == "na must be one of error, drop, got 'skip'"


def ratings_frame() -> pd.DataFrame:
    return pd.read_csv(io.StringIO(RATINGS))


def test_client_dataframe_names_the_missing_column_and_drops_on_request(server: Server):
    frame = ratings_frame()
    with Client(server.base_url) as client:
        with pytest.raises(ValueError) as error:
            client.upload(frame, target="rating", ignore=["user_id", "item_id", "title"])
        assert str(error.value).startswith(
            "column 'year' of the DataFrame, row 3 is missing (NaN); pass na='drop'"
        )
        dataset = client.upload(
            frame, target="rating", ignore=["user_id", "title"], keep=["item_id"], na="drop"
        )
    assert dataset.n_rows == 4
    assert dataset.dropped_rows == {"year": 1, "price": 1, "rating": 1}
    assert dataset.columns == {"item_id": "string"}


def test_client_parquet_with_nulls_drops_on_request(server: Server, tmp_path: Path):
    path = tmp_path / "ratings.parquet"
    pq.write_table(
        pa.table({"x": pa.array([1.0, None, 3.0, 4.0]), "y": pa.array([1.0, 2.0, None, 5.0])}),
        path,
    )
    with Client(server.base_url) as client:
        with pytest.raises(ValueError, match=r"column 'x' of the Parquet file ratings\.parquet"):
            client.upload(path, target="y")
        dataset = client.upload(path, target="y", na="drop")
    assert (dataset.n_rows, dataset.dropped_rows) == (2, {"x": 1, "y": 1})


def test_cli_fit_na_drop_says_what_it_left_out(server: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=60, seed=4)
    lines = ["a,b,c,y", *(",".join(map(repr, [*row, target])) for row, target in
                          zip(X.tolist(), y.tolist(), strict=True))]  # fmt: skip
    lines[5] = lines[5].replace(lines[5].split(",")[1], "", 1)
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    environment = {**os.environ, "MIXREG_URL": server.base_url}
    command = [str(REPO / ".venv" / "bin" / "mixreg"), "fit", str(path), "--target", "y",
               "--k", "2", "--param", "n_init=2"]  # fmt: skip
    refused = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert refused.returncode == 2
    assert "column 'b' is empty" in refused.stderr and "--na drop" in refused.stderr
    fitted = subprocess.run(
        [*command, "--na", "drop"], capture_output=True, text=True, env=environment, timeout=120
    )
    assert fitted.returncode == 0, fitted.stderr
    assert "left out rows with a missing value, per column: 'b' 1" in fitted.stderr


# --- the client checks NaN before sending ---


def test_client_names_a_nan_before_sending(server: Server):
    X, y = mixture_data(n_rows=40, seed=2)
    with Client(server.base_url) as client:
        dataset = client.upload(X, y)
        model = client.fit(dataset, k=2, params={"n_init": 2}, seed=1).wait().model_id
        assert model is not None
        bad = X.copy()
        bad[0, 1] = np.nan
        with pytest.raises(ValueError, match=r"^X\[0\]\[1\] is NaN; all values must be finite"):
            client.predict(model, bad)
        bad[0, 1] = -np.inf
        with pytest.raises(ValueError, match=r"^X\[0\]\[1\] is -infinite"):
            client.predict(model, bad)
        targets = y.copy()
        targets[3] = np.nan
        with pytest.raises(ValueError, match=r"^y\[3\] is NaN"):
            client.score(model, X, targets)
        with pytest.raises(ValueError, match=r"^X\[0\]\[1\] is -infinite"):
            client.upload(bad, y)


# --- one rule for lists of names ---


@pytest.mark.parametrize(
    "fields",
    [
        [("ignore", "user_id,item_id,title")],
        [("ignore", "user_id"), ("ignore", "item_id, title")],
        [("features", "year,price")],
        [("features", "year"), ("features", "price"), ("keep", "user_id,title")],
    ],
    ids=["comma", "repeated", "features-comma", "features-repeated"],
)
def test_lists_of_names_take_commas_and_repeats(server: Server, fields):
    answer = upload_csv(server, [("target", "rating"), ("na", "drop"), *fields])
    assert answer.status_code == 201, answer.text
    assert answer.json()["feature_names"] == ["year", "price"]


def test_raw_body_ignore_takes_a_comma_list(server: Server):
    answer = server.client.post(
        "/datasets?target=rating&ignore=user_id,item_id&ignore=title&na=drop",
        content=RATINGS.encode(),
        headers={"Content-Type": "text/csv"},
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["feature_names"] == ["year", "price"]


def test_npy_feature_names_take_a_comma_list(server: Server):
    X, y = mixture_data(n_rows=20, seed=1)
    files = {}
    for name, array in (("X", X), ("y", y)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        files[name] = (f"{name}.npy", buffer.getvalue(), "application/octet-stream")
    answer = server.client.post("/datasets", files=files, data={"feature_names": "p,q,r"})
    assert answer.status_code == 201, answer.text
    assert answer.json()["feature_names"] == ["p", "q", "r"]


def test_a_text_column_error_says_how_to_leave_it_out(server: Server):
    answer = upload_csv(server, [("target", "rating"), ("ignore", "item_id,title")])
    assert answer.status_code == 422
    assert answer.json()["detail"] == (
        "CSV line 2, column 'user_id': 'u00044' is not a number; to leave out a column of ids "
        "or text, upload with ignore=user_id, or keep it beside the features with keep=user_id"
    )
