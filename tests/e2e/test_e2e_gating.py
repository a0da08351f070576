"""Gated fits over real HTTP: a gate on a dataset's kept column and on the features, the model
record's gate and holdout metrics (the same as the estimator's on the same split), gated
predictions in JSON (rows or named columns) and .npy, and 422s naming the bad column."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import onnxruntime
import orjson
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_gated
from mixreg_client import Client
from service.jobs.fit_spec import holdout_split

from .conftest import Server, module_sqlite_server

pytestmark = pytest.mark.e2e

N_ROWS = 600
SEED = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "gating")


@pytest.fixture(scope="module")
def data():
    return make_gated(
        n_samples=N_ROWS, n_features=2, n_components=2, n_concomitant=1, random_state=1
    )


@pytest.fixture(scope="module")
def dataset_id(server: Server, data) -> str:
    gap = data.concomitant[:, 0].tolist()
    gap[17] = None
    response = server.request(
        "POST",
        "/datasets",
        json={
            "X": data.X.tolist(),
            "y": data.y.tolist(),
            "feature_names": ["a", "b"],
            "columns": {
                "w": data.concomitant[:, 0].tolist(),
                "label": ["x"] * N_ROWS,
                "gap": gap,
            },
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def fitted_model(server: Server, body: dict) -> dict:
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "succeeded", job
    response = server.request("GET", f"/models/{job['model_id']}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_gate_on_a_kept_column_is_the_estimators_and_predicts_with_it(
    server: Server, data, dataset_id: str
):
    model = fitted_model(
        server,
        {
            "dataset_id": dataset_id,
            "k": 2,
            "algorithm": "am-classic",
            "seed": SEED,
            "gating": ["w"],
        },
    )
    gate = model["gate"]
    assert gate["concomitant"] == ["w"]
    assert server.job(model["job_id"])["gating"] == ["w"]
    # The same fit on the same training rows, here.
    train, holdout = holdout_split(N_ROWS, 0.2, SEED)
    local = MixtureOfLinearRegressions(
        n_components=2, algorithm="am-classic", gating=True, random_state=SEED
    ).fit(data.X[train], data.y[train], concomitant=data.concomitant[train])
    np.testing.assert_allclose(gate["coef"], local.gate_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gate["intercept"], local.gate_intercept_, rtol=1e-9, atol=1e-12)
    assert gate["log_likelihood"] == pytest.approx(local.log_likelihood_, rel=1e-9)
    assert gate["bic"] == pytest.approx(local.bic_, rel=1e-9)
    X_h, y_h, Z_h = data.X[holdout], data.y[holdout], data.concomitant[holdout]
    assert gate["holdout"]["log_likelihood"] == pytest.approx(
        local.gated_log_likelihood(X_h, y_h, Z_h), rel=1e-9
    )
    rmse = np.sqrt(np.mean((y_h - local.predict_most_likely(X_h, Z_h)) ** 2))
    assert gate["holdout"]["rmse_most_likely"] == pytest.approx(rmse, rel=1e-9)
    rmse = np.sqrt(np.mean((y_h - local.predict_expected(X_h, Z_h)) ** 2))
    assert gate["holdout"]["rmse_expected"] == pytest.approx(rmse, rel=1e-9)

    X, Z = data.X[:5], data.concomitant[:5]
    for concomitant in (Z.tolist(), {"w": Z[:, 0].tolist()}):
        response = server.request(
            "POST",
            f"/models/{model['id']}/predict",
            json={"X": X.tolist(), "concomitant": concomitant},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        np.testing.assert_allclose(body["probabilities"], local.predict_proba(X, Z), rtol=1e-9)
        np.testing.assert_allclose(body["expected"], local.predict_expected(X, Z), rtol=1e-9)
        np.testing.assert_allclose(body["most_likely"], local.predict_most_likely(X, Z), rtol=1e-9)
        assert body["most_likely_component"] == local.most_likely_component(X, Z).tolist()

    # The Open Inference Protocol: a second input, and the gate's outputs selectable by name.
    metadata = server.request("GET", f"/v2/models/{model['id']}").json()
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["X", "concomitant"]
    assert [tensor["name"] for tensor in metadata["outputs"]] == [
        "predictions",
        "probabilities",
        "expected",
        "most_likely",
        "most_likely_component",
    ]
    inferred = server.request(
        "POST",
        f"/v2/models/{model['id']}/infer",
        json={
            "inputs": [
                {"name": "X", "shape": [5, 2], "datatype": "FP64", "data": X.ravel().tolist()},
                {"name": "concomitant", "shape": [5, 1], "datatype": "FP64", "data": Z.tolist()},
            ],
            "outputs": [{"name": "expected"}, {"name": "most_likely_component"}],
        },
    )
    assert inferred.status_code == 200, inferred.text
    expected, component = inferred.json()["outputs"]
    assert (expected["name"], expected["datatype"], expected["shape"]) == ("expected", "FP64", [5])
    np.testing.assert_allclose(expected["data"], local.predict_expected(X, Z), rtol=1e-9)
    assert component["datatype"] == "INT64"
    assert component["data"] == local.most_likely_component(X, Z).tolist()
    header = {
        "inputs": [
            {
                "name": "X",
                "shape": [5, 2],
                "datatype": "FP64",
                "parameters": {"binary_data_size": 80},
            },
            {
                "name": "concomitant",
                "shape": [5, 1],
                "datatype": "FP64",
                "parameters": {"binary_data_size": 40},
            },
        ],
        "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
    }
    encoded = orjson.dumps(header)
    binary = server.request(
        "POST",
        f"/v2/models/{model['id']}/infer",
        content=encoded + X.astype("<f8").tobytes() + Z.astype("<f8").tobytes(),
        headers={"Inference-Header-Content-Length": str(len(encoded))},
    )
    assert binary.status_code == 200, binary.text
    length = int(binary.headers["Inference-Header-Content-Length"])
    probabilities = np.frombuffer(binary.content[length:], dtype="<f8").reshape(5, 2)
    np.testing.assert_allclose(probabilities, local.predict_proba(X, Z), rtol=1e-9)

    # ONNX: the gate's probabilities as a second output, of a second input.
    graph = server.request("GET", f"/models/{model['id']}/model.onnx")
    assert graph.status_code == 200, graph.text
    session = onnxruntime.InferenceSession(graph.content, providers=["CPUExecutionProvider"])
    predictions, probabilities = session.run(None, {"X": X, "concomitant": Z})
    np.testing.assert_allclose(probabilities, local.predict_proba(X, Z), rtol=1e-9)
    np.testing.assert_allclose(predictions, local.predict(X), rtol=1e-9)

    # Export and import keep the gate: the copy predicts the same, bit for bit.
    exported = server.request("GET", f"/models/{model['id']}/export").json()
    assert exported["gate"]["concomitant"] == ["w"]
    imported = server.request("POST", "/models/import", json=exported)
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert copy["gate"]["coef"] == gate["coef"] and copy["gate"]["holdout"] == gate["holdout"]
    answers = [
        server.request(
            "POST", f"/models/{model_id}/predict", json={"X": X.tolist(), "concomitant": Z.tolist()}
        ).json()
        for model_id in (model["id"], copy["id"])
    ]
    assert answers[0]["probabilities"] == answers[1]["probabilities"]

    missing = server.request("POST", f"/models/{model['id']}/predict", json={"X": X.tolist()})
    assert missing.status_code == 422
    assert "reads the columns w: send their values as concomitant" in missing.json()["detail"]
    wrong = server.request(
        "POST",
        "/predict",
        json={"model_id": model["id"], "X": X.tolist(), "concomitant": {"v": [1.0] * 5}},
    )
    assert wrong.status_code == 422
    assert "concomitant lacks the column 'w'" in wrong.json()["detail"]


def test_a_gate_on_the_features_answers_in_npy_by_output(server: Server, data, dataset_id: str):
    model = fitted_model(
        server, {"dataset_id": dataset_id, "k": 2, "algorithm": "em", "gating": "features"}
    )
    assert model["gate"]["concomitant"] is None
    assert len(model["gate"]["coef"][0]) == 2
    X = data.X[:7]
    json_body = server.request("POST", f"/models/{model['id']}/predict", json={"X": X.tolist()})
    assert json_body.status_code == 200, json_body.text
    buffer = io.BytesIO()
    np.save(buffer, X)
    for output in ("probabilities", "expected", "most_likely", "most_likely_component"):
        response = server.request(
            "POST",
            f"/models/{model['id']}/predict",
            params={"output": output},
            content=buffer.getvalue(),
            headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
        )
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(
            np.load(io.BytesIO(response.content)), json_body.json()[output]
        )
    unknown = server.request(
        "POST",
        f"/models/{model['id']}/predict",
        params={"output": "odds"},
        content=buffer.getvalue(),
        headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
    )
    assert unknown.status_code == 422
    assert unknown.json()["detail"].startswith("output 'odds' is unknown")
    json_unknown = server.request(
        "POST", f"/models/{model['id']}/predict", params={"output": "odds"}, json={"X": X.tolist()}
    )
    assert json_unknown.status_code == 422


def test_bad_gating_is_a_422_naming_the_column(server: Server, data, dataset_id: str):
    cases = {
        "nope": "gating[0] names the column 'nope' which the dataset does not have",
        "label": "gating[0] names 'label' which holds text; a number column is needed",
    }
    for column, detail in cases.items():
        response = server.request(
            "POST", "/fit", json={"dataset_id": dataset_id, "k": 2, "gating": ["w", column][1:]}
        )
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(detail), response.json()["detail"]
    # A missing number is the fit process's to find (the request reads no row): the job fails.
    job = server.wait_for_job(server.fit({"dataset_id": dataset_id, "k": 2, "gating": ["gap"]}))
    assert job["status"] == "failed", job
    assert job["error"].startswith("gating[0] names 'gap' which has no number in row 17;")
    inline = server.request(
        "POST",
        "/fit",
        json={
            "data": {"X": data.X[:50].tolist(), "y": data.y[:50].tolist()},
            "k": 2,
            "gating": ["w"],
        },
    )
    assert inline.status_code == 422
    assert "inline data have no extra columns" in inline.text
    plain = fitted_model(server, {"dataset_id": dataset_id, "k": 2, "algorithm": "am-classic"})
    assert plain["gate"] is None
    refused = server.request(
        "POST",
        f"/models/{plain['id']}/predict",
        json={"X": data.X[:2].tolist(), "concomitant": [[1.0], [2.0]]},
    )
    assert refused.status_code == 422
    assert "has no gate" in refused.json()["detail"]


def test_the_client_fits_a_gate_and_predicts_with_it(server: Server, data, dataset_id: str):
    with Client(server.base_url) as client:
        handle = client.fit(dataset_id, k=2, algorithm="am-classic", seed=SEED, gating=["w"])
        assert handle.wait().status == "succeeded"
        model = handle.model()
        assert model.gate is not None and model.gate["concomitant"] == ["w"]
        X, Z = data.X[:4], data.concomitant[:4]
        by_rows = client.predict_gated(model, X, Z)
        by_name = client.predict_gated(model.id, X, {"w": Z[:, 0]})
        np.testing.assert_array_equal(by_rows.probabilities, by_name.probabilities)
        np.testing.assert_allclose(by_rows.probabilities.sum(axis=1), 1.0)
        chosen = by_rows.most_likely_component
        np.testing.assert_array_equal(
            by_rows.most_likely, by_rows.predictions[np.arange(4), chosen]
        )
        np.testing.assert_allclose(
            by_rows.expected, (by_rows.predictions * by_rows.probabilities).sum(axis=1)
        )
