"""A gated fit with weights over real HTTP: the model's gate, likelihood, BIC and weighted
holdout scores are the estimator's on the same split; a gate with groups is a 422 naming
groups."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_gated
from service.jobs.fit_spec import holdout_split

from .conftest import Server, module_sqlite_server

pytestmark = pytest.mark.e2e

N_ROWS = 400
SEED = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "gate-weights")


def test_a_weighted_gate_is_the_estimators_weighted_fit(server: Server) -> None:
    data = make_gated(
        n_samples=N_ROWS, n_features=2, n_components=2, n_concomitant=1, random_state=2
    )
    weights = np.random.default_rng(4).integers(1, 4, size=N_ROWS).astype(float)
    response = server.request(
        "POST",
        "/datasets",
        json={
            "X": data.X.tolist(),
            "y": data.y.tolist(),
            "columns": {
                "w": data.concomitant[:, 0].tolist(),
                "weight": weights.tolist(),
                "user": [f"u{row % 9}" for row in range(N_ROWS)],
            },
        },
    )
    assert response.status_code == 201, response.text
    dataset_id = response.json()["id"]
    body = {
        "dataset_id": dataset_id,
        "k": 2,
        "algorithm": "am-classic",
        "seed": SEED,
        "gating": ["w"],
        "weights": "weight",
    }
    job = server.wait_for_job(server.fit(body))
    assert job["status"] == "succeeded", job
    model = server.request("GET", f"/models/{job['model_id']}").json()
    gate = model["gate"]

    train, holdout = holdout_split(N_ROWS, 0.2, SEED)
    local = MixtureOfLinearRegressions(
        n_components=2, algorithm="am-classic", gating=True, random_state=SEED
    ).fit(
        data.X[train],
        data.y[train],
        sample_weight=weights[train],
        concomitant=data.concomitant[train],
    )
    np.testing.assert_allclose(gate["coef"], local.gate_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gate["intercept"], local.gate_intercept_, rtol=1e-9, atol=1e-12)
    assert gate["log_likelihood"] == pytest.approx(local.log_likelihood_, rel=1e-9)
    assert gate["bic"] == pytest.approx(local.bic_, rel=1e-9)
    # The holdout rows count their weights: as many copies of each row.
    copies = np.repeat(holdout, weights[holdout].astype(int))
    X_h, y_h, Z_h = data.X[copies], data.y[copies], data.concomitant[copies]
    assert gate["holdout"]["log_likelihood"] == pytest.approx(
        local.gated_log_likelihood(X_h, y_h, Z_h), rel=1e-9
    )
    rmse = np.sqrt(np.mean((y_h - local.predict_most_likely(X_h, Z_h)) ** 2))
    assert gate["holdout"]["rmse_most_likely"] == pytest.approx(rmse, rel=1e-9)
    # An unweighted gate on the same rows is another fit.
    unweighted = MixtureOfLinearRegressions(
        n_components=2, algorithm="am-classic", gating=True, random_state=SEED
    ).fit(data.X[train], data.y[train], concomitant=data.concomitant[train])
    assert not np.allclose(gate["coef"], unweighted.gate_coef_)

    grouped = server.request("POST", "/fit", json={**body, "groups": "user"})
    assert grouped.status_code == 422
    assert grouped.json()["detail"].startswith("groups: a gated fit takes no groups")
    with_errors = server.request("POST", "/fit", json={**body, "standard_errors": True})
    assert with_errors.status_code == 422
    assert with_errors.json()["detail"].startswith(
        "standard_errors: a gated fit with weights has no standard errors"
    )
