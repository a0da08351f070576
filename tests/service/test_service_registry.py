"""Registered models in-process: versions from fits, aliases that move, the audit trail, and
``name@alias`` / ``name/versions/N`` wherever a model id is accepted."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from service.config import Settings

REFRESH_S = 0.05


@pytest.fixture
def settings(migrated_database_url: str) -> Settings:
    """Without the embedded worker, and with aliases followed within 50 ms."""
    return Settings(
        database_url=migrated_database_url, embedded_worker=False, alias_refresh_s=REFRESH_S
    )


def fit_version(client, run_queued_jobs, X, y, *, seed: int, name: str = "reco") -> str:
    """Fit (X, y) as the next version of ``name``; return the model id."""
    response = client.post(
        "/fit",
        json={
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "seed": seed,
            "registered_model": name,
        },
    )
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    job = client.get(response.json()["url"]).json()
    assert job["registered_model"] == name
    return str(job["model_id"])


@pytest.fixture
def two_versions(client, data, run_queued_jobs) -> tuple[str, str]:
    """Model ids of versions 1 and 2 of ``reco``: fits of the data and of the data shifted."""
    X, y = data
    first = fit_version(client, run_queued_jobs, X, y, seed=1)
    second = fit_version(client, run_queued_jobs, X, y + 10.0, seed=2)
    return first, second


def move(client, alias: str, version: int) -> dict:
    response = client.put(f"/registered-models/reco/aliases/{alias}", json={"version": version})
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_each_fit_under_a_name_becomes_its_next_version(client, two_versions):
    first, second = two_versions
    registered = client.get("/registered-models/reco").json()
    assert (registered["name"], registered["latest_version"], registered["aliases"]) == (
        "reco",
        2,
        {},
    )
    versions = client.get("/registered-models/reco/versions").json()
    assert [(item["version"], item["model_id"]) for item in versions["items"]] == [
        (2, second),
        (1, first),
    ]
    assert versions["next_cursor"] is None
    model = client.get(f"/models/{first}").json()
    assert (model["registered_model"], model["version"]) == ("reco", 1)
    listed = {item["id"]: item for item in client.get("/models").json()["items"]}
    assert (listed[second]["registered_model"], listed[second]["version"]) == ("reco", 2)
    assert client.get("/models/reco/versions/2").json()["id"] == second
    assert client.get("/models/reco").json()["id"] == second  # a bare name: the latest


def test_an_alias_moves_and_predictions_follow_it_naming_the_version(client, two_versions, data):
    first, second = two_versions
    X, _ = data
    created = move(client, "production", 1)
    assert (created["version"], created["model_id"], created["previous_version"]) == (
        1,
        first,
        None,
    )
    answer = client.post("/predict", json={"model_id": "reco@production", "X": X[:3].tolist()})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["model_id"], body["registered_model"], body["version"]) == (first, "reco", 1)
    assert answer.headers["Mixreg-Model-Version"] == "reco/versions/1"
    assert client.get("/models/reco@production").json()["id"] == first

    moved = move(client, "production", 2)
    assert (moved["version"], moved["previous_version"]) == (2, 1)
    time.sleep(2 * REFRESH_S)
    answer = client.post("/models/reco@production/predict", json={"X": X[:3].tolist()})
    assert (answer.json()["model_id"], answer.json()["version"]) == (second, 2)
    by_id = client.post(f"/models/{second}/predict", json={"X": X[:3].tolist()}).json()
    by_version = client.post("/models/reco/versions/2/predict", json={"X": X[:3].tolist()})
    assert by_version.json() == by_id == answer.json()
    by_first = client.post(f"/models/{first}/predict", json={"X": X[:3].tolist()}).json()
    assert by_first["predictions"] != by_id["predictions"]
    npy = client.post(
        "/predict?model_id=reco@production",
        content=_npy(X[:1]),
        headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
    )
    assert npy.status_code == 200, npy.text
    assert npy.headers["Mixreg-Model-Id"] == second
    assert npy.headers["Mixreg-Model-Version"] == "reco/versions/2"


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_every_alias_move_is_recorded(client, two_versions):
    move(client, "production", 1)
    move(client, "staging", 2)
    move(client, "production", 2)
    assert client.delete("/registered-models/reco/aliases/staging").status_code == 204
    events = client.get("/registered-models/reco/alias-events", params={"limit": 3}).json()
    assert [(e["alias"], e["from_version"], e["to_version"]) for e in events["items"]] == [
        ("staging", 2, None),
        ("production", 1, 2),
        ("staging", None, 2),
    ]
    assert all(event["changed_by"] is None for event in events["items"])  # no keys
    rest = client.get(
        "/registered-models/reco/alias-events", params={"cursor": events["next_cursor"]}
    ).json()
    assert [(e["alias"], e["from_version"], e["to_version"]) for e in rest["items"]] == [
        ("production", None, 1)
    ]
    assert rest["next_cursor"] is None
    assert client.get("/registered-models/reco").json()["aliases"] == {"production": 2}
    version = client.get("/registered-models/reco/versions/2").json()
    assert version["aliases"] == ["production"]


def test_a_version_behind_an_alias_is_not_deleted(client, two_versions):
    first, _ = two_versions
    move(client, "production", 1)
    refused = client.delete(f"/models/{first}")
    assert refused.status_code == 409
    assert "reco@production" in refused.json()["detail"]
    move(client, "production", 2)
    assert client.delete(f"/models/{first}").status_code == 204
    missing = client.get("/models/reco/versions/1")
    assert missing.status_code == 404
    assert "has no version 1" in missing.json()["detail"]


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/models/reco@canary", "registered model reco has no alias 'canary'"),
        ("/models/reco/versions/7", "registered model reco has no version 7"),
        ("/models/nothing@production", "model nothing@production does not exist"),
        ("/models/a@b@c", "model a@b@c does not exist"),
        ("/registered-models/nothing", "registered model nothing does not exist"),
    ],
)
def test_references_to_nothing_say_what_is_missing(client, two_versions, path, detail):
    response = client.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert detail in response.json()["detail"]


def test_bad_names_and_versions_are_refused(client, two_versions, data):
    X, y = data
    bad_name = client.post(
        "/fit",
        json={"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "registered_model": "a b"},
    )
    assert bad_name.status_code == 422
    assert "registered_model" in bad_name.json()["detail"]
    assert "is not a valid name" in bad_name.json()["detail"]
    no_version = client.put("/registered-models/reco/aliases/production", json={"version": 3})
    assert no_version.status_code == 404
    assert "has no version 3" in no_version.json()["detail"]
    bad_alias = client.put("/registered-models/reco/aliases/pro%20d", json={"version": 1})
    assert bad_alias.status_code == 422
    assert "the alias 'pro d' is not a valid name" in bad_alias.json()["detail"]
    not_a_number = client.put("/registered-models/reco/aliases/production", json={"version": "2"})
    assert not_a_number.status_code == 422
    bad_cursor = client.get("/registered-models/reco/versions", params={"cursor": "zz"})
    assert bad_cursor.status_code == 422
    assert "is not a cursor of this list" in bad_cursor.json()["detail"]


def test_the_inference_protocol_addresses_versions_and_aliases(client, two_versions, data):
    first, second = two_versions
    X, _ = data
    move(client, "production", 1)
    metadata = client.get("/v2/models/reco").json()
    assert (metadata["name"], metadata["versions"]) == ("reco", ["1", "2"])
    request = {
        "inputs": [
            {"name": "X", "datatype": "FP64", "shape": [2, 2], "data": X[:2].ravel().tolist()}
        ]
    }
    for path, version, model_id in (
        ("/v2/models/reco/versions/1/infer", "1", first),
        ("/v2/models/reco/infer", "2", second),
        ("/v2/models/reco@production/infer", "1", first),
    ):
        answer = client.post(path, json=request)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_version"] == version
        expected = client.post(f"/models/{model_id}/predict", json={"X": X[:2].tolist()})
        assert (
            answer.json()["outputs"][0]["data"] == np.ravel(expected.json()["predictions"]).tolist()
        )
    assert client.get(f"/v2/models/{first}/versions/1/ready").status_code == 200
    missing = client.get("/v2/models/reco/versions/9")
    assert missing.status_code == 404
    assert missing.json()["error"] == "registered model reco has no version 9"
    not_a_number = client.get("/v2/models/reco/versions/one")
    assert not_a_number.status_code == 404
    assert "versions are numbers" in not_a_number.json()["error"]


def fit_job(client, run_queued_jobs, X, y, **body) -> dict:
    response = client.post("/fit", json={"data": {"X": X.tolist(), "y": y.tolist()}, **body})
    assert response.status_code == 202, response.text
    run_queued_jobs()
    job = dict(client.get(response.json()["url"]).json())
    assert job["status"] == "succeeded", job["error"]
    return job


@pytest.mark.parametrize("algorithm", ["auto", "am", "am-classic", "em"])
def test_a_fit_warm_started_from_an_alias_starts_from_its_lines(
    client, run_queued_jobs, noisy_data, algorithm
):
    X, y = noisy_data
    first = fit_job(client, run_queued_jobs, X[:50], y[:50], k=2, registered_model="reco")
    move(client, "production", 1)
    lines = client.get("/models/reco@production").json()["components"]
    common = {"k": 2, "algorithm": algorithm, "seed": 3}
    cold = fit_job(client, run_queued_jobs, X[50:], y[50:], **common)
    warm = fit_job(client, run_queued_jobs, X[50:], y[50:], init_model="reco@production", **common)
    assert warm["params"]["init"] == [[*line["coef"], line["intercept"]] for line in lines]
    cold_model = client.get(f"/models/{cold['model_id']}").json()
    warm_model = client.get(f"/models/{warm['model_id']}").json()
    assert first["model_id"] != warm["model_id"]
    if algorithm == "auto":
        assert warm_model["candidates"][0]["source"] == "init"
        assert warm_model["candidates"][0]["n_iter"] < cold_model["candidates"][0]["n_iter"]
    else:
        assert warm_model["n_iter"] < cold_model["n_iter"]
    assert warm_model["train_min_loss"] <= cold_model["train_min_loss"] * 1.001


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"k": 3}, 422, "has k=2 lines, but the fit asks for k=3; ask for k=2"),
        ({"k": [2, 3]}, 422, "gives the starting lines of one k"),
        ({"k": 2, "fit_intercept": False}, 422, "was fitted with fit_intercept=true"),
        ({"k": 2, "algorithm": "subsample"}, 422, "algorithm subsample takes no starting lines"),
        ({"k": 2, "feature_names": ["a", "b"]}, 422, "was fitted on the features [x0, x1] (2)"),
        (
            {"k": 2, "algorithm": "am", "params": {"init": [[1, 2, 3], [4, 5, 6]]}},
            422,
            "init_model reco and params.init both give starting lines",
        ),
        ({"k": 2, "init_model": "reco@canary"}, 404, "has no alias 'canary'"),
    ],
)
def test_a_warm_start_that_does_not_fit_is_refused(
    client, two_versions, data, body, status, detail
):
    X, y = data
    body = dict(body)  # the parameters are shared by both backends' runs
    names = body.pop("feature_names", None)
    request = {
        "data": {"X": X.tolist(), "y": y.tolist(), **({"feature_names": names} if names else {})},
        "init_model": "reco",
        **body,
    }
    response = client.post("/fit", json=request)
    assert response.status_code == status, response.text
    assert detail in response.json()["detail"]
