"""Keyed predictions in binary over real HTTP: an ``.npz`` body of the rows ``X`` and their
``keys`` answers what the JSON body answers (in JSON or ``.npy``), and every bad archive is a
4xx naming what is wrong."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

import numpy as np
import pytest

from .conftest import Server, module_sqlite_server
from .test_e2e_keyed import fit_accounts, upload

pytestmark = pytest.mark.e2e

NPZ = "application/x-npz"
MAX_DECODED_BYTES = 100_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(
        tmp_path_factory, "keyed-binary", MIXREG_MAX_DECODED_BYTES=str(MAX_DECODED_BYTES)
    )


@pytest.fixture(scope="module")
def keyed_model(server: Server) -> tuple[str, np.ndarray, list]:
    return fit_accounts(server)


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def post(server: Server, model_id: str, body: bytes, query: str = "", **headers: str):
    return server.request(
        "POST",
        f"/models/{model_id}/predict{query}",
        content=body,
        headers={"Content-Type": NPZ, **headers},
    )


def problem(response, status: int = 422) -> str:
    assert response.status_code == status, response.text
    detail: str = response.json()["detail"]
    return detail


def test_an_npz_body_predicts_each_row_by_its_key(server: Server, keyed_model):
    model_id, X, names = keyed_model
    rows = [5, 6, 7, 100, 200]
    keys = [names[row] for row in rows] + ["nobody"]
    X_asked = np.vstack([X[rows], X[:1]])
    expected = server.request(
        "POST", f"/models/{model_id}/predict", json={"X": X_asked.tolist(), "keys": keys}
    ).json()["predictions"]

    answer = post(server, model_id, npz(X=X_asked, keys=np.array(keys)))
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["predictions"], expected, rtol=1e-12)
    # The unknown key got the global model's lines, as in JSON.
    assert answer.json()["predictions"][-1] != answer.json()["predictions"][0]

    binary = post(server, model_id, npz(X=X_asked, keys=np.array(keys)), Accept="application/x-npy")
    assert binary.headers["content-type"] == "application/x-npy"
    np.testing.assert_allclose(np.load(io.BytesIO(binary.content)), expected, rtol=1e-12)

    # POST /predict names the model in the query, as for an .npy body.
    by_query = server.request(
        "POST",
        f"/predict?model_id={model_id}",
        content=npz(X=X_asked, keys=np.array(keys)),
        headers={"Content-Type": NPZ},
    )
    np.testing.assert_allclose(by_query.json()["predictions"], expected, rtol=1e-12)


def test_unknown_keys_error_names_the_key(server: Server, keyed_model):
    model_id, X, names = keyed_model
    body = npz(X=X[:2], keys=np.array([names[5], "nobody"]))
    assert "nobody" in problem(post(server, model_id, body, "?unknown_keys=error"))
    assert "choose global or error" in problem(post(server, model_id, body, "?unknown_keys=x"))
    # A JSON body says unknown_keys in its own field.
    json_body = server.request(
        "POST",
        f"/models/{model_id}/predict?unknown_keys=error",
        json={"X": X[:1].tolist(), "keys": [names[5]]},
    )
    assert "query parameter is for .npz bodies" in problem(json_body)


def test_integer_keys_of_an_integer_keyed_model(server: Server):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((400, 2))
    account = np.repeat(np.arange(8), 50)
    y = X @ [1.0, 2.0] * np.where(rng.random(400) < 0.5, 1, -1) + account
    dataset_id = upload(server, X, y, {"account": account.tolist()})
    job_id = server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account"})
    model_id = server.wait_for_job(job_id, timeout=300)["model_id"]
    keys = np.array([0, 3, 7], dtype=np.uint16)
    answer = post(server, model_id, npz(X=X[[0, 150, 399]], keys=keys))
    expected = server.request(
        "POST",
        f"/models/{model_id}/predict",
        json={"X": X[[0, 150, 399]].tolist(), "keys": keys.tolist()},
    ).json()["predictions"]
    np.testing.assert_allclose(answer.json()["predictions"], expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("arrays", "named"),
    [
        ({"X": np.ones((2, 2))}, "exactly the arrays X and keys; it holds X"),
        (
            {"X": np.ones((2, 2)), "keys": np.array(["a", "b"]), "y": np.ones(2)},
            "it holds X, keys, y",
        ),
        ({"X": np.ones((2, 2)), "keys": np.array(["a"])}, "one key per row of X (2)"),
        ({"X": np.ones((2, 2)), "keys": np.array([1.5, 2.5])}, "1-D integers or text"),
        ({"X": np.ones((2, 2)), "keys": np.array(["a", ""])}, "keys[1] must be a text"),
        ({"X": np.ones((2, 2)), "keys": np.array(["a", "b\x00c"])}, "keys[1] must be a text"),
        ({"X": np.ones((1, 2)), "keys": np.array(["x" * 300])}, "keys[0] must be a text"),
        (
            {"X": np.ones((1, 2)), "keys": np.array([2**63], dtype=np.uint64)},
            "keys[0] is beyond a 64-bit",
        ),
        ({"X": np.array([[1.0, np.nan]]), "keys": np.array(["a"])}, "X[0][1]"),
        ({"X": np.ones(2), "keys": np.array(["a", "b"])}, "the .npz array X"),
    ],
)
def test_bad_npz_bodies_are_422s_naming_what_is_wrong(server, keyed_model, arrays, named):
    model_id, _, _ = keyed_model
    assert named in problem(post(server, model_id, npz(**arrays)))


def test_no_pickle_and_no_zip_bomb(server: Server, keyed_model):
    model_id, _, _ = keyed_model
    # Object keys are pickled by numpy: the server never unpickles them.
    buffer = io.BytesIO()
    np.savez(buffer, X=np.ones((1, 2)), keys=np.array([{"a": 1}], dtype=object))
    assert "integers or text" in problem(post(server, model_id, buffer.getvalue()))
    assert "not a readable zip archive" in problem(post(server, model_id, b"not a zip"))
    # A small archive that would decompress beyond the decoded-size limit is refused from its
    # declared size, before it is decompressed.
    big = npz(X=np.zeros((MAX_DECODED_BYTES // 8, 2)), keys=np.zeros(MAX_DECODED_BYTES // 8))
    assert len(big) < MAX_DECODED_BYTES
    assert "MIXREG_MAX_DECODED_BYTES" in problem(post(server, model_id, big), 413)
    # A member whose data are corrupt is a 422, not a 500.
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("X.npy", b"\x93NUMPY garbage")
        archive.writestr("keys.npy", b"\x93NUMPY garbage")
    assert "X" in problem(post(server, model_id, raw.getvalue()))


def test_an_npy_body_to_a_keyed_model_points_to_npz(server: Server, keyed_model):
    model_id, _, _ = keyed_model
    buffer = io.BytesIO()
    np.save(buffer, np.ones((1, 2)))
    response = server.request(
        "POST",
        f"/models/{model_id}/predict",
        content=buffer.getvalue(),
        headers={"Content-Type": "application/x-npy"},
    )
    assert NPZ in problem(response)
