"""Standard errors of a gated fit over real HTTP: asked for, stored and shown in
GET /models/{id} (the gate's rows beside the lines'), the same as the estimator's on the same
training rows; a gated fit computes none unless asked, and a gated bootstrap is a 422."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_gated
from mixreg_client import Client
from service.jobs.fit_spec import holdout_split

from .conftest import Server, module_sqlite_server

pytestmark = pytest.mark.e2e

N_ROWS = 800
SEED = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "gate-errors")


@pytest.fixture(scope="module")
def data():
    return make_gated(
        n_samples=N_ROWS, n_features=2, n_components=2, n_concomitant=1, random_state=2
    )


@pytest.fixture(scope="module")
def dataset_id(server: Server, data) -> str:
    response = server.request(
        "POST",
        "/datasets",
        json={
            "X": data.X.tolist(),
            "y": data.y.tolist(),
            "feature_names": ["a", "b"],
            "columns": {"w": data.concomitant[:, 0].tolist()},
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _fitted(server: Server, body: dict) -> dict:
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "succeeded", job
    response = server.request("GET", f"/models/{job['model_id']}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_gated_fit_stores_and_shows_the_gates_standard_errors(
    server: Server, data, dataset_id: str
):
    body = {
        "dataset_id": dataset_id,
        "k": 2,
        "algorithm": "am-classic",
        "seed": SEED,
        "gating": ["w"],
    }
    model = _fitted(server, {**body, "standard_errors": True})
    train, _ = holdout_split(N_ROWS, 0.2, SEED)
    local = MixtureOfLinearRegressions(
        n_components=2,
        algorithm="am-classic",
        gating=True,
        standard_errors=True,
        random_state=SEED,
    ).fit(data.X[train], data.y[train], concomitant=data.concomitant[train])

    uncertainty = model["uncertainty"]
    assert uncertainty["method"] == "observed-information"
    assert uncertainty["log_likelihood"] == pytest.approx(local.log_likelihood_, rel=1e-9)
    # The gate: component 1 against the reference 0, its intercept then its slope on w.
    (row,) = uncertainty["gate"]
    assert row["component"] == 1
    assert row["intercept"]["estimate"] == pytest.approx(local.gate_intercept_[1], rel=1e-9)
    assert row["intercept"]["std_error"] == pytest.approx(local.gate_intercept_se_[1], rel=1e-9)
    (slope,) = row["coef"]
    assert slope["estimate"] == pytest.approx(local.gate_coef_[1, 0], rel=1e-9)
    assert slope["std_error"] == pytest.approx(local.gate_coef_se_[1, 0], rel=1e-9)
    assert slope["std_error"] > 0
    assert slope["z_value"] == pytest.approx(slope["estimate"] / slope["std_error"], rel=1e-12)
    assert slope["lower"] < slope["estimate"] < slope["upper"]
    # The gate the model record shows is the one the errors belong to.
    np.testing.assert_allclose(model["gate"]["coef"], local.gate_coef_, rtol=1e-9, atol=1e-12)
    # The lines: errors of every coefficient and noise variance; the weights have none.
    for line, component in enumerate(model["components"]):
        estimates = component["estimates"]
        np.testing.assert_allclose(
            [entry["std_error"] for entry in estimates["coef"]], local.coef_se_[line], rtol=1e-9
        )
        assert estimates["intercept"]["std_error"] == pytest.approx(
            local.intercept_se_[line], rel=1e-9
        )
        assert estimates["noise_variance"]["std_error"] == pytest.approx(
            local.noise_variance_se_[line], rel=1e-9
        )
        assert estimates["weight"]["std_error"] is None

    # The client's table lists the gate's rows after the lines'.
    with Client(server.base_url) as client:
        table = client.get_model(model["id"]).summary()
    gate_rows = [row for row in table.rows if row["parameter"].startswith("gate:")]
    assert [(row["component"], row["parameter"]) for row in gate_rows] == [
        (1, "gate:(Intercept)"),
        (1, "gate:w"),
    ]
    assert gate_rows[1]["std_error"] == pytest.approx(local.gate_coef_se_[1, 0], rel=1e-9)
    assert "gate:w" in str(table)

    # Unless asked, a gated fit has none (whatever its size).
    plain = _fitted(server, body)
    assert plain["uncertainty"] is None
    assert plain["gate"] is not None


def test_a_gated_bootstrap_is_a_422_naming_n_bootstrap(server: Server, dataset_id: str):
    response = server.request(
        "POST",
        "/fit",
        json={
            "dataset_id": dataset_id,
            "k": 2,
            "gating": ["w"],
            "standard_errors": True,
            "n_bootstrap": 10,
        },
    )
    assert response.status_code == 422, response.text
    assert "n_bootstrap" in response.json()["detail"]
