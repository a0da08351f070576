"""A keyed model out and back over real HTTP: its export is a zip archive of its document and
every key's lines, which imports to a model whose keyed predictions equal the original's bit
for bit; its ONNX graph takes each row's key beside X and runs in ONNX Runtime to the keyed
predictions, and every bad archive is a 4xx naming what is wrong."""

from __future__ import annotations

import io
import itertools
import json
import zipfile
from collections.abc import Iterator

import numpy as np
import onnxruntime
import pytest

from mixreg import MixtureOfLinearRegressions

from .conftest import Server, module_sqlite_server
from .test_e2e_keyed import fit_accounts, upload

pytestmark = pytest.mark.e2e

ZIP = "application/zip"
MAX_DECODED_BYTES = 200_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(
        tmp_path_factory, "keyed-export", MIXREG_MAX_DECODED_BYTES=str(MAX_DECODED_BYTES)
    )


@pytest.fixture(scope="module")
def keyed_model(server: Server) -> tuple[str, np.ndarray, list]:
    return fit_accounts(server)


@pytest.fixture(scope="module")
def archive(server: Server, keyed_model) -> bytes:
    model_id, _, _ = keyed_model
    response = server.request("GET", f"/models/{model_id}/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ZIP
    assert response.headers["content-disposition"].endswith(f'model-{model_id}.zip"')
    return response.content


def members(body: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rezip(contents: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def import_(server: Server, body: bytes, **params: str):
    return server.request(
        "POST", "/models/import", params=params, content=body, headers={"Content-Type": ZIP}
    )


def predict(server: Server, reference: str, X: np.ndarray, keys: list) -> np.ndarray:
    response = server.request(
        "POST", f"/models/{reference}/predict", json={"X": X.tolist(), "keys": keys}
    )
    assert response.status_code == 200, response.text
    return np.array(response.json()["predictions"])


def test_a_keyed_model_exports_and_imports_to_the_same_keyed_predictions(
    server: Server, keyed_model, archive: bytes
):
    model_id, X, names = keyed_model
    # numpy reads the archive as it is: the document beside one array per member.
    with np.load(io.BytesIO(archive), allow_pickle=False) as loaded:
        document = json.loads(loaded["model.json"])
        offsets, key_bytes = loaded["key_offsets"], loaded["key_bytes"]
        coef = loaded["coef"]
    keys = [key_bytes[start:end].tobytes().decode() for start, end in itertools.pairwise(offsets)]
    assert document["keyed"]["split_by"] == "account"
    assert document["keyed"]["key_type"] == "text"
    assert keys == sorted(set(names) - {""}) and coef.shape == (len(keys), 2, 2)

    imported = import_(server, archive, registered_model="keyed-copy")
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    original = server.request("GET", f"/models/{model_id}").json()
    assert copy["id"] != model_id and copy["split_by"] == "account"
    assert (copy["registered_model"], copy["version"]) == ("keyed-copy", 1)
    assert copy["keyed"] == original["keyed"]
    assert copy["components"] == [{**line, "estimates": None} for line in original["components"]]

    # Every row by its key's lines (a one-line key, a one-row key, the others), an unknown
    # key by the global model: bit for bit, one row at a time and in one batch.
    asked = [*keys, "nobody"]
    rows = np.vstack([X[: len(keys)], X[:1]])
    np.testing.assert_array_equal(
        predict(server, copy["id"], rows, asked), predict(server, model_id, rows, asked)
    )
    for row, key in zip(rows, asked, strict=True):
        np.testing.assert_array_equal(
            predict(server, "keyed-copy/versions/1", row[None, :], [key]),
            predict(server, model_id, row[None, :], [key]),
        )
    for key in ("tiny", "single", names[-1]):
        assert server.request("GET", f"/models/{copy['id']}/keys/{key}").json() == {
            **server.request("GET", f"/models/{model_id}/keys/{key}").json(),
            "model_id": copy["id"],
        }
    unknown = server.request(
        "POST",
        f"/models/{copy['id']}/predict",
        json={"X": X[:1].tolist(), "keys": ["nobody"], "unknown_keys": "error"},
    )
    assert unknown.status_code == 422 and "nobody" in unknown.json()["detail"]
    # The re-imported model exports to the same lines again.
    again = members(server.request("GET", f"/models/{copy['id']}/export").content)
    first = members(archive)
    assert {name: data for name, data in again.items() if name != "model.json"} == {
        name: data for name, data in first.items() if name != "model.json"
    }


def test_an_integer_keyed_model_exports_and_imports(server: Server):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((400, 2))
    account = np.repeat(np.arange(8) * 1000 - 3000, 50)
    y = X @ [1.0, 2.0] * np.where(rng.random(400) < 0.5, 1, -1) + account / 1000
    dataset_id = upload(server, X, y, {"account": account.tolist()})
    job_id = server.fit({"dataset_id": dataset_id, "k": 2, "split_by": "account"})
    model_id = server.wait_for_job(job_id, timeout=300)["model_id"]
    exported = server.request("GET", f"/models/{model_id}/export").content
    with np.load(io.BytesIO(exported), allow_pickle=False) as loaded:
        assert loaded["keys"].tolist() == sorted(set(account.tolist()))
    imported = import_(server, exported)
    assert imported.status_code == 201, imported.text
    keys = [*account[::37].tolist(), 12345]
    rows = np.vstack([X[::37], X[:1]])
    expected = predict(server, model_id, rows, keys)
    np.testing.assert_array_equal(predict(server, imported.json()["id"], rows, keys), expected)
    # Its ONNX graph takes int64 keys.
    graph = server.request("GET", f"/models/{model_id}/model.onnx").content
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (answer,) = session.run(None, {"X": rows, "key": np.array(keys, dtype=np.int64)})
    np.testing.assert_allclose(answer, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


def test_a_keyed_document_alone_is_never_a_plain_model(server: Server, archive: bytes):
    document = members(archive)["model.json"]
    alone = server.request(
        "POST", "/models/import", content=document, headers={"Content-Type": "application/json"}
    )
    assert alone.status_code == 422
    assert "keyed model's document" in alone.json()["detail"]
    assert "application/zip" in alone.json()["detail"]
    with pytest.raises(ValueError, match="keyed model's"):
        MixtureOfLinearRegressions.from_dict(json.loads(document))


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-12), ("float32", 1e-6)])
def test_onnx_runtime_runs_a_keyed_graph_to_the_keyed_predictions(
    server: Server, keyed_model, dtype: str, rtol: float
):
    model_id, X, names = keyed_model
    response = server.request("GET", f"/models/{model_id}/model.onnx", params={"dtype": dtype})
    assert response.status_code == 200, response.text
    session = onnxruntime.InferenceSession(response.content, providers=["CPUExecutionProvider"])
    assert [(tensor.name, tensor.type) for tensor in session.get_inputs()] == [
        ("X", {"float64": "tensor(double)", "float32": "tensor(float)"}[dtype]),
        ("key", "tensor(string)"),
    ]
    # Every known key (a one-line key, a one-row key), and an unknown one: the global model.
    keys = [*sorted(set(names) - {""}), "nobody"]
    rows = np.vstack([X[: len(keys) - 1], X[:1]])
    (answer,) = session.run(None, {"X": rows.astype(dtype), "key": np.array(keys, dtype=object)})
    expected = predict(server, model_id, rows.astype(dtype).astype(np.float64), keys)
    assert answer.shape == expected.shape and answer.dtype == np.dtype(dtype)
    np.testing.assert_allclose(answer, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
    assert not np.allclose(answer[-1], answer[0])


def _changed(archive: bytes, **arrays: np.ndarray) -> bytes:
    contents = members(archive)
    contents.update({f"{name}.npy": npy(array) for name, array in arrays.items()})
    return rezip(contents)


def _document_changed(archive: bytes, change) -> bytes:
    contents = members(archive)
    document = json.loads(contents["model.json"])
    change(document)
    contents["model.json"] = json.dumps(document).encode()
    return rezip(contents)


def test_bad_archives_are_4xx_naming_what_is_wrong(server: Server, archive: bytes):
    contents = members(archive)
    with np.load(io.BytesIO(archive), allow_pickle=False) as loaded:
        arrays = {name: loaded[name] for name in loaded.files if name != "model.json"}
    n_keys = len(arrays["key_offsets"]) - 1

    n_models = server.request("GET", "/models").json()["total"]

    def refused(body: bytes, status: int = 422) -> str:
        response = import_(server, body)
        assert response.status_code == status, response.text
        detail: str = response.json()["detail"]
        return detail

    assert "not a readable zip archive" in refused(b"not a zip")
    assert "it lacks coef" in refused(
        rezip({name: data for name, data in contents.items() if name != "coef.npy"})
    )
    assert "it also holds extra" in refused(rezip({**contents, "extra.npy": npy(np.ones(2))}))
    assert "no model.json" in refused(
        rezip({name: data for name, data in contents.items() if name != "model.json"})
    )
    assert "coef must be a C-order array of float64 of shape" in refused(
        _changed(archive, coef=arrays["coef"][:, :1])
    )
    assert "coef must be a C-order array of float64" in refused(
        _changed(archive, coef=arrays["coef"].astype(np.float32))
    )
    assert "coef must hold finite numbers" in refused(
        _changed(archive, coef=np.where(arrays["coef"] == 0, np.inf, arrays["coef"]))
    )
    assert "status must hold indices" in refused(
        _changed(archive, status=np.full(n_keys, 9, dtype=np.int8))
    )
    swapped = arrays["key_offsets"].copy()
    key_bytes = arrays["key_bytes"].tobytes()
    first, second = key_bytes[: swapped[1]], key_bytes[swapped[1] : swapped[2]]
    swapped[1] = len(second)
    reordered = np.frombuffer(second + first + key_bytes[swapped[2] :], dtype=np.uint8)
    assert "sorted and distinct" in refused(
        _changed(archive, key_offsets=swapped, key_bytes=reordered)
    )
    # An object array would be unpickled by numpy: the header's dtype refuses it first.
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}] * n_keys, dtype=object), allow_pickle=True)
    contents_pickled = {**contents, "status.npy": pickled.getvalue()}
    assert "status" in refused(rezip(contents_pickled))
    # A few kilobytes that would inflate past the decoded-size limit: refused from the
    # headers, before anything is inflated.
    n_big = MAX_DECODED_BYTES // 8
    bomb = _document_changed(archive, lambda document: document["keyed"].update(n_keys=n_big))
    bomb_contents = members(bomb)
    bomb_contents.update(
        {
            "key_offsets.npy": npy(np.arange(n_big + 1, dtype=np.int64)),
            "key_bytes.npy": npy(np.full(n_big, ord("a"), dtype=np.uint8)),
            "coef.npy": npy(np.zeros((n_big, 2, 2))),
        }
    )
    compressed = rezip(bomb_contents, zipfile.ZIP_DEFLATED)
    assert len(compressed) < MAX_DECODED_BYTES
    assert "MIXREG_MAX_DECODED_BYTES" in refused(compressed, 413)
    # The document inside is checked as a JSON import is.
    assert "n_components" in refused(
        _document_changed(archive, lambda document: document.update(n_components=500))
    )
    assert "keyed.split_by" in refused(
        _document_changed(archive, lambda document: document["keyed"].update(split_by="s" * 300))
    )
    assert "keyed.summary" in refused(
        _document_changed(archive, lambda document: document["keyed"].update(summary={"x": 1}))
    )
    # Nothing of the refused archives was stored.
    assert server.request("GET", "/models").json()["total"] == n_models
