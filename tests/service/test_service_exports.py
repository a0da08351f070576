"""Export and import of a model's JSON document, and its ONNX graph run by ONNX Runtime."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest

from mixreg import KeyedMixture, MixtureOfLinearRegressions
from service.errors import ConflictError
from service.serving import exports
from service.serving.prediction import StoredLines

WIDE = np.random.default_rng(5).standard_normal((300, 2)) * [1e3, 1e-2]


def predictions(client, reference: str, X: np.ndarray) -> np.ndarray:
    response = client.post(f"/models/{reference}/predict", json={"X": X.tolist()})
    assert response.status_code == 200, response.text
    return np.array(response.json()["predictions"])


def test_an_exported_document_imports_to_the_same_predictions(client, model_id):
    exported = client.get(f"/models/{model_id}/export")
    assert exported.status_code == 200
    assert exported.headers["content-disposition"].endswith(f'model-{model_id}.json"')
    document = exported.json()
    assert (document["format"], document["format_version"], document["gate"]) == (
        "mixreg-model",
        1,
        None,
    )
    assert document["feature_names"] == ["x0", "x1"]
    assert document["provenance"]["model_id"] == model_id
    assert (
        document["metrics"]["train_min_loss"]
        == client.get(f"/models/{model_id}").json()["train_min_loss"]
    )
    imported = client.post(
        "/models/import",
        params={"registered_model": "moved"},
        content=exported.content,
        headers={"content-type": "application/json"},
    )
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert copy["id"] != model_id and imported.headers["location"] == copy["url"]
    assert (copy["registered_model"], copy["version"]) == ("moved", 1)
    original = client.get(f"/models/{model_id}").json()
    # The document carries the lines; the standard errors belong to the fit, not to it.
    lines = [{**component, "estimates": None} for component in original["components"]]
    assert copy["components"] == lines
    assert copy["baseline"] == original["baseline"]
    np.testing.assert_array_equal(
        predictions(client, "moved/versions/1", WIDE), predictions(client, model_id, WIDE)
    )
    estimator = MixtureOfLinearRegressions.from_dict(json.loads(exported.content))
    np.testing.assert_array_equal(estimator.predict(WIDE), predictions(client, model_id, WIDE))


def test_an_estimators_own_document_imports_once_metrics_are_added(client):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 2))
    y = np.where(rng.integers(0, 2, 60), X @ [1.0, 2.0], X @ [-1.0, 0.5] + 3)
    estimator = MixtureOfLinearRegressions(2, random_state=0).fit(X, y)
    document = estimator.to_dict(feature_names=["u", "v"])
    missing = client.post("/models/import", json=document)
    assert missing.status_code == 422
    assert "has no 'metrics'" in missing.json()["detail"]
    document["metrics"] = {
        "train_min_loss": estimator.train_loss_,
        "n_train": 60,
        "baseline": {
            "coef": [0.0, 0.0],
            "intercept": 1.0,
            "train_min_loss": 4.0,
            "holdout_min_loss": None,
        },
    }
    imported = client.post("/models/import", json=document)
    assert imported.status_code == 201, imported.text
    model = imported.json()
    assert model["feature_names"] == ["u", "v"] and model["job_id"] is None
    np.testing.assert_array_equal(predictions(client, model["id"], X), estimator.predict(X))


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"format": "pickle"}, "not a model document"),
        ({"coef": [[1.0]]}, "'coef' must have shape (2, 2)"),
        ({"metrics": {"n_train": 3}}, "metrics.train_min_loss: Field required"),
        ({"metrics": None}, "metrics.train_min_loss: Field required"),
        ({"provenance": {"seed": -1}}, "provenance.seed: Input should be greater than or equal"),
    ],
)
def test_a_bad_document_is_refused_naming_what_is_wrong(client, model_id, change, detail):
    document = {**client.get(f"/models/{model_id}/export").json(), **change}
    response = client.post("/models/import", json=document)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert detail in response.json()["detail"]


def test_an_import_under_a_bad_name_is_refused(client, model_id):
    document = client.get(f"/models/{model_id}/export").json()
    response = client.post("/models/import", params={"registered_model": "a/b"}, json=document)
    assert response.status_code == 422
    assert "is not a valid name" in response.json()["detail"]


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-12), ("float32", 1e-6)])
def test_onnx_runtime_runs_the_exported_graph_to_mixregs_predictions(client, model_id, dtype, rtol):
    response = client.get(f"/models/{model_id}/model.onnx", params={"dtype": dtype})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    session = onnxruntime.InferenceSession(response.content, providers=["CPUExecutionProvider"])
    (tensor_in,), (tensor_out,) = session.get_inputs(), session.get_outputs()
    element = {"float64": "tensor(double)", "float32": "tensor(float)"}[dtype]
    assert (tensor_in.name, tensor_in.type, tensor_in.shape[1]) == ("X", element, 2)
    assert (tensor_out.name, tensor_out.type, tensor_out.shape[1]) == ("predictions", element, 2)
    X = WIDE.astype(dtype)
    (onnx_predictions,) = session.run(None, {"X": X})
    assert onnx_predictions.dtype == np.dtype(dtype) and onnx_predictions.shape == (300, 2)
    expected = predictions(client, model_id, X.astype(np.float64))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(onnx_predictions, expected, rtol=rtol, atol=rtol * scale)


def test_onnx_of_an_alias_and_of_an_unknown_type(client, model_id):
    document = client.get(f"/models/{model_id}/export").json()
    client.post("/models/import", params={"registered_model": "reco"}, json=document)
    client.put("/registered-models/reco/aliases/production", json={"version": 1})
    assert client.get("/models/reco@production/model.onnx").status_code == 200
    refused = client.get(f"/models/{model_id}/model.onnx", params={"dtype": "int8"})
    assert refused.status_code == 422
    assert "dtype" in refused.json()["detail"]


def _wide_document(client, model_id: str, k: int, d: int) -> dict:
    """The exported document of ``model_id`` grown to ``k`` lines of ``d`` features: valid in
    every other way."""
    document = client.get(f"/models/{model_id}/export").json()
    document.update(
        n_components=k,
        n_features=d,
        feature_names=[f"f{j}" for j in range(d)],
        coef=np.zeros((k, d)).tolist(),
        intercept=np.arange(k, dtype=float).tolist(),
        shares=np.full(k, 1 / k).tolist(),
    )
    document["metrics"]["baseline"]["coef"] = [0.0] * d
    return document


def refused(response, *named: str) -> str:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    detail: str = response.json()["detail"]
    for name in named:
        assert name in detail
    return detail


def test_an_import_beyond_max_k_is_refused_naming_n_components(client, model_id):
    document = _wide_document(client, model_id, k=150, d=15)
    refused(client.post("/models/import", json=document), "n_components", "MIXREG_MAX_K")
    assert client.get("/models").json()["total"] == 1


def test_an_import_beyond_max_features_is_refused_naming_n_features(client, model_id):
    document = _wide_document(client, model_id, k=2, d=1500)
    refused(client.post("/models/import", json=document), "n_features", "MIXREG_MAX_FEATURES")
    assert client.get("/models").json()["total"] == 1


def test_an_import_of_an_unknown_algorithm_is_refused_naming_it(client, model_id):
    document = {**client.get(f"/models/{model_id}/export").json(), "algorithm": "a" * 5000}
    detail = refused(client.post("/models/import", json=document), "'algorithm'")
    assert len(detail) < 1000


def test_an_import_with_a_feature_name_too_long_is_refused_naming_it(client, model_id):
    document = {
        **client.get(f"/models/{model_id}/export").json(),
        "feature_names": ["x0", "n" * 100_000],
    }
    detail = refused(client.post("/models/import", json=document), "feature_names.1", "256")
    assert len(detail) < 1000


def test_an_import_with_bogus_candidates_is_refused_naming_them(client, model_id):
    document = client.get(f"/models/{model_id}/export").json()
    document["provenance"]["candidates"] = [{"bogus": 1}]
    refused(client.post("/models/import", json=document), "provenance.candidates.0")
    assert client.get("/models").json()["total"] == 1


def test_an_imported_dataset_id_is_never_joined_to_a_dataset_here(client, model_id, data):
    other = client.post(
        "/datasets",
        json={"X": np.ones((5, 3)).tolist(), "y": [1.0, 2.0, 3.0, 4.0, 5.0]},
    )
    assert other.status_code == 201, other.text
    document = client.get(f"/models/{model_id}/export").json()
    document["provenance"]["dataset_id"] = other.json()["id"]
    imported = client.post("/models/import", json=document)
    assert imported.status_code == 201, imported.text
    assert imported.json()["dataset_id"] != other.json()["id"]
    picture = client.get(f"/models/{imported.json()['id']}/plot.png")
    assert picture.status_code == 404
    assert "imported" in picture.json()["detail"]


def test_a_keyed_graph_beyond_one_onnx_file_is_a_conflict_naming_the_export(monkeypatch):
    keyed = KeyedMixture(
        keys=np.array(["a", "b"]),
        coef=np.zeros((2, 2, 3)),
        intercept=np.zeros((2, 2)),
        shares=np.full((2, 2), 0.5),
        min_loss=np.zeros(2),
        n_rows=np.full(2, 10),
        status=np.zeros(2, dtype=np.int8),
    )
    lines = StoredLines(
        model_id="m", coef=np.zeros((2, 3)), intercept=np.zeros(2), split_by="acct", keyed=keyed
    )
    assert exports.onnx_keyed_model(lines, dtype="float64")
    monkeypatch.setattr(exports, "MAX_ONNX_BYTES", 100)
    with pytest.raises(ConflictError, match=r"more than one ONNX graph holds.*/export"):
        exports.onnx_keyed_model(lines, dtype="float64")


def test_a_float32_graph_keeps_its_accuracy_on_features_far_from_zero(client, run_queued_jobs):
    """Years near 2000, prices in the hundreds and popularity counts in the ten thousands: the
    lines' terms nearly cancel their intercepts, which a float32 sum misses by 1e-5."""
    rng = np.random.default_rng(9)
    n = 400
    X = np.column_stack(
        [
            rng.integers(1960, 2025, n),
            np.round(rng.uniform(100, 900, n), 2),
            rng.integers(1_000, 90_000, n),
        ]
    )
    line = rng.integers(0, 2, n)
    y = np.where(
        line == 0,
        0.031 * (X[:, 0] - 1990) + 2e-5 * X[:, 2] - 1,
        -0.017 * (X[:, 0] - 2010) + 1e-3 * X[:, 1] - 1e-5 * X[:, 2],
    )
    y = y + rng.normal(0, 0.01, n)
    fitted = client.post(
        "/fit",
        json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "algorithm": "am", "seed": 1},
    )
    assert fitted.status_code == 202, fitted.text
    assert run_queued_jobs() == ["succeeded"]
    model_id = client.get(fitted.json()["url"]).json()["model_id"]
    response = client.get(f"/models/{model_id}/model.onnx", params={"dtype": "float32"})
    session = onnxruntime.InferenceSession(response.content, providers=["CPUExecutionProvider"])
    X32 = X.astype(np.float32)
    (onnx_predictions,) = session.run(None, {"X": X32})
    assert onnx_predictions.dtype == np.float32
    # The rows the graph was given (prices rounded to float32), predicted by mixreg.
    expected = predictions(client, model_id, X32.astype(np.float64))
    assert np.abs(expected).max() < 10
    np.testing.assert_allclose(onnx_predictions, expected, rtol=1e-6, atol=1e-6)


def test_a_keyed_float32_graph_keeps_its_accuracy_on_years():
    """Each key's lines on years near 2000: float32 arithmetic would miss by 1e-5."""
    rng = np.random.default_rng(3)
    n_keys, k = 3, 2
    slopes = rng.uniform(-0.05, 0.05, (n_keys + 1, k, 2))
    centre = np.array([1995.0, 20_000.0])
    # Lines through a modest value at the centre: big intercepts cancelling big terms.
    intercept = rng.uniform(-1, 1, (n_keys + 1, k)) - slopes @ centre
    keyed = KeyedMixture(
        keys=np.array([10, 20, 30]),
        coef=slopes[:n_keys],
        intercept=intercept[:n_keys],
        shares=np.full((n_keys, k), 0.5),
        min_loss=np.zeros(n_keys),
        n_rows=np.full(n_keys, 10),
        status=np.zeros(n_keys, dtype=np.int8),
    )
    lines = StoredLines(
        model_id="m", coef=slopes[-1], intercept=intercept[-1], split_by="acct", keyed=keyed
    )
    session = onnxruntime.InferenceSession(
        exports.onnx_keyed_model(lines, dtype="float32"), providers=["CPUExecutionProvider"]
    )
    X = np.column_stack([rng.integers(1960, 2025, 200), rng.integers(19_000, 21_000, 200)])
    keys = rng.choice([10, 20, 30, 99], 200)
    (got,) = session.run(None, {"X": X.astype(np.float32), "key": keys.astype(np.int64)})
    position = np.select([keys == 10, keys == 20, keys == 30], [0, 1, 2], default=n_keys)
    expected = np.einsum("nkd,nd->nk", slopes[position], X) + intercept[position]
    assert got.dtype == np.float32 and np.abs(expected).max() < 100
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
